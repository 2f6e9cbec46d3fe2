"""`kernels.group_norm` against torch and its own fp32 reference: fp32, bf16 rounded once, fp32 only inside fusions."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from cogvideox_torchax.kernels.conv import conv
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


_CONV1 = dict(stride=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1))


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
