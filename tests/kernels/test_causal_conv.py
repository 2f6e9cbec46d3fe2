"""kernels.causal_conv against upstream's `CogVideoXCausalConv3d`, batch after batch (its patch: families/cogvideox)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

from cogvideox_torchax.kernels.causal_conv import causal_conv3d, causal_conv3d_reference, state_shape
from tests.support.parity import assert_close

# Batch lengths as the decoder sees them (3 then 2s), and shorter than the
# cache (1 frame) where the new state still holds the previous one's sums.
SEQUENCES = [[3, 2, 2], [1, 1, 2, 1], [2, 1, 3]]


def _upstream_conv(c_in, c_out, seed):
    torch.manual_seed(seed)
    # pad_mode="first" is what CogVideoX's resnet blocks build.
    return CogVideoXCausalConv3d(c_in, c_out, kernel_size=3, pad_mode="first").eval()


def _batches(sizes, c, h, w, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, c, t, h, w, generator=g) for t in sizes]


@pytest.mark.parametrize("sizes", SEQUENCES, ids=str)
def test_batches_match_upstream_module(sizes):
    module = _upstream_conv(6, 5, seed=0)
    weight, bias = jnp.asarray(module.conv.weight.detach().numpy()), jnp.asarray(module.conv.bias.detach().numpy())
    cache, state = None, None
    for i, x in enumerate(_batches(sizes, 6, 7, 9, seed=1)):
        with torch.no_grad():
            expected, cache = module(x, conv_cache=cache)
        got, state = causal_conv3d(jnp.asarray(x.numpy()), state, weight, bias, padding_hw=(1, 1))
        assert state.shape == state_shape(x.shape, weight.shape, (1, 1)) == (2, 2, 7, 9, 5)
        assert_close(np.asarray(got), expected.numpy(), atol=2e-5, label=f"batch {i} of {sizes}", check_dtype=False)


@pytest.mark.parametrize("kernel", [2, 4])
@pytest.mark.parametrize("sizes", [[3, 1, 1, 2], [1, 4]], ids=str)
def test_other_time_kernels_match_the_reference(kernel, sizes):
    rng = np.random.default_rng(kernel)
    weight = jnp.asarray(rng.standard_normal((4, 3, kernel, 3, 3)), jnp.float32) * 0.3
    cache, state = None, None
    for i, t in enumerate(sizes):
        x = jnp.asarray(rng.standard_normal((1, 3, t, 5, 4)), jnp.float32)
        expected, cache = causal_conv3d_reference(x, cache, weight, None, padding_hw=(1, 1))
        got, state = causal_conv3d(x, state, weight, None, padding_hw=(1, 1))
        assert_close(got, expected, atol=2e-5, label=f"k={kernel} batch {i} of {sizes}")


@pytest.mark.parametrize("in_order", [False, True], ids=["", "in_order"])
@pytest.mark.parametrize("sizes", [*SEQUENCES, [8, 8, 8]], ids=str)
def test_input_frame_cache_is_upstreams(sizes, in_order):
    # cache_inputs carries upstream's own cache (the last k - 1 input frames)
    # and rebuilds the partial sums from it: equal outputs, equal caches.
    rng = np.random.default_rng(len(sizes))
    weight = jnp.asarray(rng.standard_normal((7, 2, 3, 3, 3)), jnp.float32) * 0.3
    bias = jnp.asarray(rng.standard_normal(7), jnp.float32)
    cache, state = None, None
    for i, t in enumerate(sizes):
        x = jnp.asarray(rng.standard_normal((2, 2, t, 6, 5)), jnp.float32)
        expected, cache = causal_conv3d_reference(x, cache, weight, bias, padding_hw=(1, 1))
        got, state = causal_conv3d(
            x, state, weight, bias, padding_hw=(1, 1), cache_inputs=True, in_order=in_order
        )
        assert state.shape == (2, 2, 2, 6, 5)  # 2 input channels, not the 7 output channels of the sums
        assert_close(got, expected, atol=2e-5, label=f"batch {i} of {sizes}")
        assert_close(state, cache, atol=0, label=f"cache after batch {i} of {sizes}")


@pytest.mark.parametrize("cache_inputs", [False, True], ids=["sums", "inputs"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_in_order_matches_the_free_order(k, cache_inputs):
    # The barriers only fix when each addend is added; with a bias XLA may
    # round the last add differently, so to an ulp-sized tolerance (2e-5).
    rng = np.random.default_rng(5 + k)
    weight = jnp.asarray(rng.standard_normal((4, 3, k, 3, 3)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(4), jnp.float32)
    state, cache = None, None
    for i, t in enumerate((3, 2, 1, 2)):
        x = jnp.asarray(rng.standard_normal((1, 3, t, 5, 4)), jnp.float32)
        kwargs = dict(padding_hw=(1, 1), cache_inputs=cache_inputs)
        free, next_state = causal_conv3d(x, state, weight, bias, **kwargs)
        ordered, ordered_state = causal_conv3d(x, state, weight, bias, in_order=True, **kwargs)
        expected, cache = causal_conv3d_reference(x, cache, weight, bias, padding_hw=(1, 1))
        assert_close(ordered, free, atol=2e-5, label=f"in_order vs free, batch {i}")
        assert_close(ordered, expected, atol=2e-5, label=f"in_order vs reference, batch {i}")
        assert_close(ordered_state, next_state, atol=2e-5, label=f"state after batch {i}")
        state = next_state


def test_flops_are_the_analytic_convolution_flops():
    n, c, t, h, w, o, k = 1, 16, 8, 12, 10, 24, 3
    x = jax.ShapeDtypeStruct((n, c, t, h, w), jnp.float32)
    state = jax.ShapeDtypeStruct(state_shape(x.shape, (o, c, k, 3, 3), (1, 1)), jnp.float32)
    weight = jax.ShapeDtypeStruct((o, c, k, 3, 3), jnp.float32)
    bias = jax.ShapeDtypeStruct((o,), jnp.float32)
    compiled = causal_conv3d.lower(x, state, weight, bias, padding_hw=(1, 1)).compile()
    flops = compiled.cost_analysis()["flops"]
    # Upstream's padded 3-D convolution's multiply-adds on real data (XLA
    # does not count taps that land on the zero padding of H and W; the
    # cache frames are data): (3h - 2)(3w - 2) spatial taps per frame.
    analytic = 2 * n * t * c * o * k * (3 * h - 2) * (3 * w - 2)
    print(f"[causal_conv] XLA flops / analytic = {flops / analytic:.4f}")
    assert analytic <= flops <= 1.02 * analytic


@pytest.mark.parametrize(
    "wshape,bshape,match",
    [((5, 4, 3, 3, 3), (5,), "in-channels"), ((5, 6, 3, 3, 3), (4,), "bias"), ((5, 6, 1, 3, 3), (5,), "time kernel")],
)
def test_bad_shapes_are_named(wshape, bshape, match):
    with pytest.raises(ValueError, match=match):
        causal_conv3d(jnp.zeros((1, 6, 2, 4, 4)), None, jnp.zeros(wshape), jnp.zeros(bshape), padding_hw=(1, 1))


def test_tail_is_built_from_its_frames_not_zeros():
    # A zero-filled tail is one constant that XLA shares between every conv
    # of a shape and copies before each in-place update: in a scanned encode
    # those zeros stayed alive through the loop (0.54 GiB at the peak of the
    # 2b encode of 49 frames at 480x720). The tail starts as the first
    # frames landing in it.
    for cache_inputs in (False, True):
        x = jax.ShapeDtypeStruct((1, 4, 8, 6, 5), jnp.float32)
        weight = jax.ShapeDtypeStruct((4, 4, 3, 3, 3), jnp.float32)
        shape = (1, 4, 2, 6, 5) if cache_inputs else state_shape(x.shape, weight.shape, (1, 1))
        state = jax.ShapeDtypeStruct(shape, jnp.float32)
        text = causal_conv3d.lower(x, state, weight, None, padding_hw=(1, 1), cache_inputs=cache_inputs).as_text()
        tail = "tensor<1x2x6x5x4xf32>"
        zeros = [line for line in text.splitlines() if "broadcast" in line and line.rstrip().endswith(f"-> {tail}")]
        assert not zeros, zeros
        assert "stablehlo.pad" in text
