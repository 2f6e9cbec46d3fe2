"""`kernels.conv` against torch and its own fp32 reference: split convolutions, the bf16 bias rounded once."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from cogvideox_torchax.kernels.conv import conv, conv_reference
from tests.support import stablehlo_rules as hlo
from tests.support.parity import assert_close


@pytest.mark.parametrize(
    "shape,wshape,kw",
    [
        ((2, 6, 9, 11), (5, 6, 3, 3), dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))),
        ((1, 4, 5, 7, 6), (8, 4, 3, 3, 3), dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1))),
        ((1, 4, 5, 7, 6), (4, 2, 3, 1, 3), dict(stride=(2, 1, 2), padding=(1, 0, 2), dilation=(1, 1, 2), groups=2)),
    ],
)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("channels_last", [True, False])
def test_conv_matches_torch_fp32(shape, wshape, kw, with_bias, channels_last):
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, wshape, wshape[:1]))
    b = b if with_bias else None
    torch_conv = torch.nn.functional.conv2d if len(shape) == 4 else torch.nn.functional.conv3d
    t = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
    expected = torch_conv(t(x), t(w), t(b), **kw).numpy()
    jb = None if b is None else jnp.asarray(b)
    got = np.asarray(conv(jnp.asarray(x), jnp.asarray(w), jb, channels_last=channels_last, **kw))
    # Outputs reach ~30 here; fp32 summation order alone moves them ~1e-6 relative.
    assert_close(got, expected, atol=1e-5, rtol=1e-5, label=f"conv fp32 {shape}")
    ref = np.asarray(conv_reference(jnp.asarray(x), jnp.asarray(w), None if b is None else jnp.asarray(b), **kw))
    assert_close(ref, expected, atol=1e-5, rtol=1e-5, label=f"conv_reference fp32 {shape}")


@pytest.mark.parametrize(
    "shape,wshape,kw,limit,pieces",
    [
        # Batch pieces (the upsamplers' 2-D convs run frames as the batch).
        ((6, 4, 5, 7), (5, 4, 3, 3), dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1)), 600, 2),
        # Batch, then time with the causal halo inside each sample.
        ((3, 4, 6, 5, 7), (5, 4, 3, 3, 3), dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1)), 700, 6),
        # Time, with time padding, stride and dilation.
        ((1, 4, 9, 5, 7), (5, 4, 3, 3, 3), dict(stride=(2, 1, 1), padding=(1, 1, 1), dilation=(1, 1, 1)), 700, 3),
        ((1, 4, 9, 5, 7), (5, 4, 3, 1, 1), dict(stride=(1, 1, 1), padding=(0, 0, 0), dilation=(2, 1, 1)), 1000, 2),
        # One time row (its three input frames) above the limit: each one split
        # along height, then along width too (frames larger than the GPU
        # plan's chunk size, above 768x1360).
        ((1, 4, 4, 6, 7), (5, 4, 3, 3, 3), dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1)), 400, 6),
        ((1, 4, 4, 6, 7), (5, 4, 3, 3, 3), dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1)), 200, 36),
    ],
)
@pytest.mark.parametrize("channels_last", [True, False])
def test_split_conv_equals_the_whole(shape, wshape, kw, limit, pieces, channels_last):
    rng = np.random.default_rng(0)
    x, w, b = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in (shape, wshape, wshape[:1]))
    split = jax.jit(lambda x: conv(x, w, b, channels_last=channels_last, max_elements=limit, **kw))
    text = split.lower(x).as_text()
    assert text.count("stablehlo.convolution") == pieces
    # Every convolution's input and result within the limit (the weights are
    # not split; on the models they are far below it).
    conv_lines = [ln for ln in text.splitlines() if "stablehlo.convolution" in ln]
    for ln in conv_lines:
        dims = re.findall(r"tensor<([\dx]+)xf32>", ln.rsplit(" : ", 1)[-1])
        assert all(math.prod(int(d) for d in t.split("x")) <= limit for t in (dims[0], dims[-1])), ln
    # fp32 summation order differs between the pieces and the whole.
    assert_close(split(x), conv_reference(x, w, b, **kw), atol=2e-5, label=f"split conv {shape} <= {limit}")


def test_split_conv_refuses_what_cannot_fit():
    # The smallest piece, one output element's window (4 channels x 5 dilated
    # frames x 3 x 3), holds 180 input elements.
    x = jnp.zeros((1, 4, 9, 5, 7), jnp.float32)
    w = jnp.zeros((5, 4, 3, 3, 3), jnp.float32)
    with pytest.raises(ValueError, match="cannot split a convolution"):
        conv(x, w, None, stride=(1, 1, 1), padding=(0, 0, 0), dilation=(2, 1, 1), max_elements=179)
    assert conv(x, w, None, stride=(1, 1, 1), padding=(0, 0, 0), dilation=(2, 1, 1), max_elements=180).shape == (
        1, 5, 5, 3, 5)


def test_conv_bias_after_rounding_emits_bf16_from_the_convolution():
    x = jnp.ones((1, 4, 3, 5, 5), jnp.bfloat16)
    w = jnp.ones((4, 4, 3, 3, 3), jnp.bfloat16)
    b = jnp.ones((4,), jnp.bfloat16)
    kw = dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1))
    after = jax.jit(lambda x: conv(x, w, b, bias_in_fp32=False, **kw)).lower(x).as_text()
    inside = jax.jit(lambda x: conv(x, w, b, **kw)).lower(x).as_text()
    conv_out = lambda text: [ln.rsplit("->", 1)[-1] for ln in text.splitlines() if "stablehlo.convolution" in ln]  # noqa: E731
    assert all("bf16" in t for t in conv_out(after)) and all("f32" in t and "bf16" not in t for t in conv_out(inside))


def test_conv_bf16_rounds_once_like_torch():
    # torch adds the bias in the fp32 accumulator and rounds once; a bf16 conv
    # followed by a bf16 bias add rounds twice. Measured against fp32, ours
    # must be as good as torch's (same rounding) and better than the two-step.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 5, 18, 18)).astype(np.float32)
    w = (rng.standard_normal((8, 8, 3, 3, 3)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(8) * 3).astype(np.float32)
    kw = dict(stride=(1, 1, 1), padding=(0, 1, 1), dilation=(1, 1, 1))
    bf = lambda a: torch.from_numpy(a).bfloat16()  # noqa: E731
    exact = torch.nn.functional.conv3d(bf(x).float(), bf(w).float(), bf(b).float(), **kw)
    torch_bf16 = torch.nn.functional.conv3d(bf(x), bf(w), bf(b), **kw).float()
    jb = lambda a: jnp.asarray(a, jnp.bfloat16)  # noqa: E731
    ours = torch.from_numpy(np.array(conv(jb(x), jb(w), jb(b), **kw).astype(jnp.float32)))
    two_step = conv(jb(x), jb(w), None, **kw) + jb(b).reshape(1, -1, 1, 1, 1)
    two_step = torch.from_numpy(np.array(two_step.astype(jnp.float32)))
    rms = lambda a: float((a - exact).pow(2).mean().sqrt())  # noqa: E731
    print(f"[conv bf16] rms vs fp32: ours {rms(ours):.3e}, torch {rms(torch_bf16):.3e}, two-step {rms(two_step):.3e}")
    assert conv(jb(x), jb(w), jb(b), **kw).dtype == jnp.bfloat16
    assert rms(ours) <= 1.05 * rms(torch_bf16)
    assert rms(two_step) > 1.3 * rms(ours)


def test_conv_bf16_keeps_fp32_only_in_the_epilogue():
    shape = (1, 16, 3, 8, 8)
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    w = jax.ShapeDtypeStruct((16, 16, 3, 3, 3), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((16,), jnp.bfloat16)
    kw = dict(stride=(1, 1, 1), padding=(1, 1, 1), dilation=(1, 1, 1))
    lowered = jax.jit(lambda x, w, b: conv(x, w, b, **kw)).lower(x, w, b).as_text()
    assert "xf32>" in lowered  # the accumulator really is fp32
    assert not hlo.fp32_escapes(lowered, min_elements=math.prod(shape))


@pytest.mark.parametrize("kwargs,match", [(dict(wshape=(4, 3, 3, 3)), "in-channels"), (dict(bshape=(5,)), "bias")])
def test_conv_bad_shapes_are_named(kwargs, match):
    x = jnp.zeros((1, 4, 6, 6))
    w = jnp.zeros(kwargs.get("wshape", (4, 4, 3, 3)))
    b = jnp.zeros(kwargs.get("bshape", (4,)))
    with pytest.raises(ValueError, match=match):
        conv(x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1))
