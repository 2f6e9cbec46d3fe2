"""`kernels.upsample`: nearest and nearest-exact as torch's interpolate, index takes and gathers as `jnp.take`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from cogvideox_torchax.kernels.upsample import nearest, nearest_indices


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


@pytest.mark.parametrize(("size", "out", "factor"), [(5, 10, 2.0), (7, 3, None), (4, 9, None), (3, 7, 2.5)])
def test_nearest_exact_indices_are_torchs(size, out, factor):
    x = torch.arange(size, dtype=torch.float32).reshape(1, 1, size)
    kwargs = {"scale_factor": factor} if factor else {"size": out}
    expected = torch.nn.functional.interpolate(x, mode="nearest-exact", **kwargs)[0, 0].long().numpy()
    np.testing.assert_array_equal(nearest_indices(size, len(expected), factor, exact=True), expected)
    got = nearest(jnp.asarray(x.numpy()), (len(expected),), (factor,) if factor else None, exact=True)
    np.testing.assert_array_equal(np.asarray(got)[0, 0], expected.astype(np.float32))
