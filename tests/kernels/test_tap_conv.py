"""kernels.tap_conv against its reference and upstream's `WanCausalConv3d`, and what it leaves out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cogvideox_torchax.kernels.tap_conv import tap_conv3d, tap_conv3d_reference
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

from tests.support.parity import assert_close

# The causal convolutions Wan builds: 3x3x3 (resnets, conv_in/out), the time
# upsampler's (3,1,1), the shortcut's 1x1x1, the encoder's downsampler
# ((3,1,1), stride 2 in time, no padding), and a strided 3x3x3.
CONVS = [
    {"kernel_size": 3, "padding": 1},
    {"kernel_size": (3, 1, 1), "padding": (1, 0, 0)},
    {"kernel_size": 1},
    {"kernel_size": (3, 1, 1), "stride": (2, 1, 1)},
    {"kernel_size": 3, "padding": 1, "stride": (1, 2, 2)},
]
# (frames, cache frames): none (the first chunk), fewer, as many as and more
# than the causal padding (F.pad then drops frames), no frame at all.
CALLS = [(1, None), (1, 1), (1, 2), (4, 2), (2, 1), (3, 0), (5, None), (2, 3)]


def _kwargs(module: WanCausalConv3d) -> dict:
    return {"time_padding": module._padding[4], "padding_hw": (module._padding[2], module._padding[0]),
            "stride": tuple(module.stride), "dilation": tuple(module.dilation)}  # fmt: skip


@pytest.mark.parametrize("conv", CONVS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_equals_upstream_module_and_the_reference(conv):
    torch.manual_seed(0)
    module = WanCausalConv3d(5, 6, **conv).eval()
    weight, bias = (jnp.asarray(p.detach().numpy()) for p in (module.weight, module.bias))
    g = torch.Generator().manual_seed(1)
    checked = 0
    for frames, cached in CALLS:
        x = torch.randn(2, 5, frames, 7, 9, generator=g)
        cache = None if cached is None else torch.randn(2, 5, cached, 7, 9, generator=g)
        try:
            with torch.no_grad():
                expected = module(x, cache).numpy()
        except RuntimeError:  # fewer frames than the kernel needs: upstream refuses too
            with pytest.raises(ValueError, match="no output frame"):
                tap_conv3d(jnp.asarray(x.numpy()), None, weight, bias, **_kwargs(module))
            continue
        # Upstream reads the cache only where it pads time (the patch passes None otherwise).
        c = None if cache is None or module._padding[4] == 0 else jnp.asarray(cache.numpy())
        got = tap_conv3d(jnp.asarray(x.numpy()), c, weight, bias, **_kwargs(module))
        reference = tap_conv3d_reference(jnp.asarray(x.numpy()), c, weight, bias, **_kwargs(module))
        label = f"{conv} frames {frames} cache {cached}"
        assert_close(got, expected, atol=1e-5, label=label, check_dtype=False)
        assert_close(reference, expected, atol=1e-5, label=label + " (reference)", check_dtype=False)
        checked += 1
    assert checked >= 3


def test_real_widths_within_fp32_tolerance():
    # Wan 2.1's top resnet conv: 96 -> 96 channels, 4 new frames after a 2-frame cache.
    rng = np.random.default_rng(0)
    x, cache = (jnp.asarray(rng.standard_normal((1, 96, t, 12, 10)), jnp.float32) for t in (4, 2))
    weight = jnp.asarray(rng.standard_normal((96, 96, 3, 3, 3)) / np.sqrt(96 * 27), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(96), jnp.float32)
    kwargs = {"time_padding": 2, "padding_hw": (1, 1)}
    got = tap_conv3d(x, cache, weight, bias, **kwargs)
    assert_close(got, tap_conv3d_reference(x, cache, weight, bias, **kwargs), atol=1e-5, rtol=1e-5)


def _convolutions(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("stablehlo.convolution")


def test_taps_on_zero_padding_are_not_convolved():
    w = jnp.ones((3, 2, 3, 3, 3), jnp.float32)
    one, two = jnp.ones((1, 2, 1, 4, 4)), jnp.ones((1, 2, 2, 4, 4))
    kwargs = {"time_padding": 2, "padding_hw": (1, 1)}
    # The first chunk: one frame after two zero frames reads tap 2 alone.
    assert _convolutions(lambda x: tap_conv3d(x, None, w, None, **kwargs), one) == 1
    # One cached frame: the output reads one zero frame (tap 0) and two real ones.
    assert _convolutions(lambda x, c: tap_conv3d(x, c, w, None, **kwargs), one, one) == 2
    # A whole cache: every tap reads real frames, each one 2-D convolution of every frame it reads.
    assert _convolutions(lambda x, c: tap_conv3d(x, c, w, None, **kwargs), two, two) == 3


def test_bad_arguments_are_named():
    x, w = jnp.ones((1, 2, 2, 4, 4)), jnp.ones((3, 2, 3, 3, 3))
    with pytest.raises(ValueError, match="input channels 2 != weight in-channels 4"):
        tap_conv3d(x, None, jnp.ones((3, 4, 3, 3, 3)), None, time_padding=2, padding_hw=(1, 1))
    with pytest.raises(ValueError, match="cache must be frames"):
        tap_conv3d(x, jnp.ones((1, 2, 2, 4, 5)), w, None, time_padding=2, padding_hw=(1, 1))
    with pytest.raises(ValueError, match="bias must have shape"):
        tap_conv3d(x, None, w, jnp.ones(2), time_padding=2, padding_hw=(1, 1))
