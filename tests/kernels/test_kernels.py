"""The kernels (group_norm, silu, conv, upsample) against torch and their own fp32 references."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cogvideox_torchax.kernels.conv import conv, conv_reference
from cogvideox_torchax.kernels.group_norm import group_norm, group_norm_reference

from tests.support import stablehlo_rules as hlo
from tests.support.parity import assert_close

SHAPES = [
    ((2, 8, 6, 10), 2),  # 4-D, as the upsamplers see it
    ((1, 64, 3, 5, 13), 32),  # 5-D, CogVideoX's 32 groups, odd width
    ((2, 12, 2, 4, 6), 3),  # 3 groups of 4 channels
    ((1, 6, 2, 3, 7), 6),  # one channel per group
]


def _inputs(shape, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    # a large mean against the spread: one-pass variance would fail here
    x = rng.standard_normal(shape).astype(np.float32) * 2 + 30
    return x, rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)


@pytest.mark.parametrize("shape,groups", SHAPES)
def test_fp32_matches_torch(shape, groups):
    x, w, b = _inputs(shape)
    expected = torch.nn.functional.group_norm(
        torch.from_numpy(x), groups, torch.from_numpy(w), torch.from_numpy(b), 1e-6
    )
    got = group_norm(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), num_groups=groups, eps=1e-6)
    assert_close(np.asarray(got), expected.numpy(), atol=2e-5, label=f"fp32 {shape} G={groups}")
    ref = group_norm_reference(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), num_groups=groups, eps=1e-6)
    assert_close(np.asarray(ref), expected.numpy(), atol=2e-5, label="reference")


@pytest.mark.parametrize("shape,groups", SHAPES)
def test_bf16_matches_torch(shape, groups):
    x, w, b = _inputs(shape)
    xb = torch.from_numpy(x).bfloat16()
    # torch computes bf16 group_norm in fp32 and rounds once at the end
    expected = torch.nn.functional.group_norm(
        xb, groups, torch.from_numpy(w).bfloat16(), torch.from_numpy(b).bfloat16(), 1e-6
    )
    xj = jnp.asarray(xb.float().numpy(), jnp.bfloat16)
    got = group_norm(xj, jnp.asarray(w, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), num_groups=groups, eps=1e-6)
    assert got.dtype == jnp.bfloat16
    # Both round the same fp32 value once: equal but for the odd one-ulp tie
    # from summation order (outputs are O(3); one bf16 ulp in [2, 4) is 2^-6).
    # Before rounding once, this needed atol=0.1.
    assert_close(np.asarray(got.astype(jnp.float32)), expected.float().numpy(), atol=2**-6, label=f"bf16 {shape}")
    ref = group_norm_reference(
        xj, jnp.asarray(w, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), num_groups=groups, eps=1e-6
    )
    assert_close(
        np.asarray(got.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)), atol=0.1, label="vs reference"
    )


def test_no_affine():
    x, _, _ = _inputs((2, 4, 3, 5))
    expected = torch.nn.functional.group_norm(torch.from_numpy(x), 2, eps=1e-5)
    assert_close(
        np.asarray(group_norm(jnp.asarray(x), None, None, num_groups=2)), expected.numpy(), atol=2e-5, label="no affine"
    )


def test_bf16_keeps_fp32_only_inside_fused_computations():
    shape = (1, 32, 2, 8, 8)
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    w = jax.ShapeDtypeStruct((32,), jnp.bfloat16)
    lowered = jax.jit(lambda x, w: group_norm(x, w, w, num_groups=4, eps=1e-6)).lower(x, w).as_text()
    assert "xf32>" in lowered  # the statistics really are fp32
    escapes = hlo.fp32_escapes(lowered, min_elements=math.prod(shape))
    assert not escapes, "full-size f32 values used outside a fused computation:\n" + "\n".join(escapes)


def _upcast_norm(x, w):
    # The classic leak: normalise in fp32 and forget to cast back.
    xf = x.astype(jnp.float32)
    return (xf - xf.mean()) * w.astype(jnp.float32).reshape(1, -1, 1, 1, 1)


@pytest.mark.parametrize(
    "leak",
    [
        pytest.param(_upcast_norm, id="returned"),
        pytest.param(lambda x, w: jnp.pad(_upcast_norm(x, w), 1).astype(x.dtype), id="padded"),
        pytest.param(
            lambda x, w: conv(_upcast_norm(x, w), jnp.ones((32, 32, 1, 1, 1), x.dtype), None, **_CONV1),
            id="conv-operand",
        ),
    ],
)
def test_fp32_escape_check_catches_a_leak(leak):
    shape = (1, 32, 2, 8, 8)
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    w = jax.ShapeDtypeStruct((32,), jnp.bfloat16)
    assert hlo.fp32_escapes(jax.jit(leak).lower(x, w).as_text(), min_elements=math.prod(shape))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(shape=(2, 6, 4), groups=4), "divide"),
        (dict(shape=(6,), groups=2), r"\(N, C"),
        (dict(shape=(2, 6, 4), groups=2, wshape=(5,)), "weight"),
    ],
)
def test_bad_shapes_are_named(kwargs, match):
    x = jnp.zeros(kwargs["shape"])
    w = jnp.zeros(kwargs.get("wshape", (x.shape[1] if x.ndim > 1 else 1,)))
    with pytest.raises(ValueError, match=match):
        group_norm(x, w, None, num_groups=kwargs["groups"])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_silu_matches_torch_and_reference(dtype):
    from cogvideox_torchax.kernels.silu import silu, silu_reference

    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32) * 4
    xt = torch.from_numpy(x).to({jnp.bfloat16: torch.bfloat16, jnp.float16: torch.float16}.get(dtype, torch.float32))
    expected = torch.nn.functional.silu(xt).float().numpy()
    xj = jnp.asarray(xt.float().numpy(), dtype)
    got = silu(xj)
    assert got.dtype == dtype
    # bf16 and fp16: one rounding, as torch: equal to the last bit.
    atol = 0.0 if dtype != jnp.float32 else 1e-6
    assert_close(np.asarray(got.astype(jnp.float32)), expected, atol=atol, label=f"silu {dtype.__name__}")
    assert_close(np.asarray(silu_reference(xj).astype(jnp.float32)), expected, atol=max(atol, 1e-6), label="reference")


_CONV1 = dict(stride=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1))


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


@pytest.mark.parametrize(
    "idx,gathers",
    [
        (np.arange(7), 0),  # identity: x itself
        (np.array([0, 1, 1, 2, 2, 3, 3]), 0),  # upstream's time resize: first frame apart, the rest doubled
        (np.repeat(np.arange(7), 3), 0),  # an integer ratio
        (np.array([0, 0, 1, 1, 1, 2, 3]), 0),  # three runs
        (np.array([3, 1, 2]), 1),  # not sorted: one gather
        (np.arange(18) % 2 * 6, 1),  # more runs than are worth slicing
    ],
)
def test_take_indices_equals_take(idx, gathers):
    from cogvideox_torchax.kernels.upsample import take_indices

    x = jnp.arange(2 * 3 * 7 * 5, dtype=jnp.float32).reshape(2, 3, 7, 5)
    got = take_indices(x, idx, 2)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.take(x, jnp.asarray(idx), axis=2)))
    text = jax.jit(lambda v: take_indices(v, idx, 2)).lower(x).as_text()
    assert text.count('"stablehlo.gather"') == gathers
    assert "stablehlo.compare" not in text  # no bounds handling: the indices are valid by construction


@pytest.mark.parametrize(
    "idx,is_sorted",
    [(np.array([0, 0, 1, 1, 2, 2]), True), (np.array([2, 1, 1, 0, 2]), False), (np.array([0, 1, 9]), True)],
)
@pytest.mark.parametrize("axis", [1, 2, 3])
def test_gather_indices_equals_take_as_one_gather_without_a_nested_jit(idx, is_sorted, axis):
    from cogvideox_torchax.kernels.upsample import gather_indices

    x = jnp.arange(2 * 3 * 7 * 5, dtype=jnp.float32).reshape(2, 3, 7, 5)
    got = gather_indices(x, idx, axis)  # 9 is out of range on every axis: clamped, as jnp's "clip"
    expected = jnp.take(x, jnp.asarray(idx), axis=axis, mode="clip")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    eqns = jax.make_jaxpr(lambda v: gather_indices(v, idx, axis))(x).jaxpr.eqns
    assert [e.primitive.name for e in eqns] == ["gather"]
    assert eqns[0].params["indices_are_sorted"] is is_sorted


@pytest.mark.parametrize(
    "shape,kwargs",
    [
        ((1, 3, 4, 5), dict(scale_factor=2.0)),  # the upsamplers, 2-D
        ((1, 3, 2, 4, 5), dict(scale_factor=2.0)),  # the upsamplers, 3-D (time too)
        ((1, 4, 2, 3, 3), dict(size=(4, 12, 12))),  # SpatialNorm: latent to activation size
        ((1, 4, 3, 3, 5), dict(size=(5, 7, 11))),  # non-integer ratios: a take, not a repeat
        ((2, 2, 6, 7), dict(size=(3, 4))),  # downsizing
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nearest_matches_torch_interpolate(shape, kwargs, dtype):
    from cogvideox_torchax.kernels.upsample import nearest, nearest_reference

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected = torch.nn.functional.interpolate(x, **kwargs)
    xj = jnp.asarray(x.float().numpy(), jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32)
    factors = [kwargs["scale_factor"]] * (len(shape) - 2) if "scale_factor" in kwargs else None
    got = nearest(xj, expected.shape[2:], factors)
    assert got.dtype == xj.dtype
    # Nearest only copies values: exactly equal.
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), expected.float().numpy())
    ref = nearest_reference(xj, expected.shape[2:], factors)
    np.testing.assert_array_equal(np.asarray(ref.astype(jnp.float32)), expected.float().numpy())
