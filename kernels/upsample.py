"""Nearest-neighbour resize in the input's dtype, as `F.interpolate(mode="nearest")` and ``"nearest-exact"``.

torchax has no JAX lowering for nearest interpolation and falls back to
torch's decomposition, which gathers from an fp32 upcast of the input: in a
bf16 decode every upsampler and every SpatialNorm materialised a full-size
fp32 copy. Nearest resizing only copies values, so nothing needs fp32: the
source index of each output position is computed on the host (shapes are
static) exactly as torch computes it, and runs of equally repeated sources
(an integer ratio, a first frame kept apart) become slices and broadcasts
(`take_indices`), anything else a gather along the axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def nearest_indices(
    in_size: int, out_size: int, scale_factor: float | None = None, *, exact: bool = False
) -> np.ndarray:
    """Source index of every output position along one axis, as torch's legacy ``"nearest"`` (or ``"nearest-exact"``).

    torch: ``int(float32(i) * scale)`` with ``scale = 1 / scale_factor`` when a
    scale factor was given, else ``in_size / out_size``; clamped to the input.
    ``exact``: pixel centres, ``floor((float32(i) + 0.5) * scale)``.
    """
    scale = 1.0 / scale_factor if scale_factor is not None else in_size / out_size
    position = np.arange(out_size, dtype=np.float32) + (np.float32(0.5) if exact else np.float32(0))
    idx = np.floor(position * np.float32(scale)).astype(np.int64)
    return np.minimum(idx, in_size - 1)


def first_frame_apart_indices(in_size: int, out_size: int, scale_factor: float | None = None) -> np.ndarray:
    """`nearest_indices` of CogVideoX's time resize that keeps the first frame apart.

    Upstream's upsampler and SpatialNorm resize the first frame on its own and
    the others together (then concatenate) when the frame count is odd and
    above one: frame 0 maps to frame 0 once, the rest resize as
    ``in_size - 1`` frames to ``out_size - 1``.
    """
    return np.concatenate([[0], 1 + nearest_indices(in_size - 1, out_size - 1, scale_factor)])


# More runs than this and one gather is the smaller program.
_MAX_RUNS = 8


def _runs(idx: np.ndarray) -> list[tuple[int, int, int]] | None:
    """``idx`` as runs ``(first, count, repeat)``: sources ``first .. first+count-1``, each ``repeat`` times in turn.

    None for unsorted indices or more than `_MAX_RUNS` runs.
    """
    if len(idx) == 0 or np.any(np.diff(idx) < 0):
        return None
    values, starts = np.unique(idx, return_index=True)
    counts = np.diff(np.append(starts, len(idx)))
    runs: list[tuple[int, int, int]] = []
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        if runs and runs[-1][0] + runs[-1][1] == v and runs[-1][2] == c:
            first, count, repeat = runs[-1]
            runs[-1] = (first, count + 1, repeat)
        else:
            runs.append((v, 1, c))
        if len(runs) > _MAX_RUNS:
            return None
    return runs


def gather_indices(x: jax.Array, idx: np.ndarray, axis: int) -> jax.Array:
    """``jnp.take(x, idx, axis, mode="clip")`` for indices known on the host, as one gather.

    The gather jnp emits (with sorted indices marked so), without the nested jit around it: a
    SpatialNorm resizes its scale and shift with one per axis, and the 2b
    decoder traced 408 of those jits.
    """
    idx = np.asarray(idx)
    offset = tuple(d for d in range(x.ndim) if d != axis)
    dims = jax.lax.GatherDimensionNumbers(offset_dims=offset, collapsed_slice_dims=(axis,), start_index_map=(axis,))
    sizes = tuple(1 if d == axis else n for d, n in enumerate(x.shape))
    return jax.lax.gather(
        x,
        idx.reshape(-1, 1).astype(np.int32),  # a constant of the program, not a device array
        dims,
        sizes,
        indices_are_sorted=bool(np.all(np.diff(idx) >= 0)),
        mode=jax.lax.GatherScatterMode.CLIP,
    )


def take_indices(x: jax.Array, idx: np.ndarray, axis: int) -> jax.Array:
    """``jnp.take(x, idx, axis)`` for indices known on the host and inside ``x``.

    Sorted indices made of a few runs (a nearest resize: each source
    repeated alike, the first frame apart) become slices and broadcasts
    (``jnp.repeat``) joined along ``axis``; anything else one gather
    whose indices are clamped, not checked. jnp's default out-of-bounds
    handling adds a compare and select per index array, which XLA folds
    away again at every compile (the 2b H200 program: ~0.4 s of ~5).
    """
    idx = np.asarray(idx)
    runs = _runs(idx)
    if runs is None:
        return gather_indices(x, idx, axis)
    parts = []
    for first, count, repeat in runs:
        part = x if count == x.shape[axis] else jax.lax.slice_in_dim(x, first, first + count, axis=axis)
        parts.append(jnp.repeat(part, repeat, axis=axis) if repeat > 1 else part)
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=axis)


def nearest(
    x: jax.Array,  # (N, C, *spatial)
    out_size: Sequence[int],
    scale_factors: Sequence[float | None] | None = None,
    *,
    exact: bool = False,
) -> jax.Array:  # (N, C, *out_size), x.dtype
    """Nearest-neighbour resize of the spatial dims of ``x`` to ``out_size``.

    Args:
        x: input, channels second, any dtype.
        out_size: output size of each spatial dim.
        scale_factors: per spatial dim, the scale factor the caller gave
            (it decides torch's index rounding), or None where a size was given.
        exact: ``"nearest-exact"``'s pixel-centre indices (`nearest_indices`).

    Returns:
        The resized array, in ``x.dtype``.
    """
    spatial = x.ndim - 2
    if len(out_size) != spatial:
        raise ValueError(f"out_size {tuple(out_size)} must name {spatial} spatial dims of {x.shape}")
    factors = list(scale_factors) if scale_factors is not None else [None] * spatial
    for d, (size, factor) in enumerate(zip(out_size, factors, strict=True)):
        axis = 2 + d
        x = take_indices(x, nearest_indices(x.shape[axis], size, factor, exact=exact), axis)
    return x


def nearest_reference(x: jax.Array, out_size: Sequence[int], scale_factors=None, *, exact: bool = False) -> jax.Array:
    """Index arithmetic in fp32 on the device, for checking `nearest`."""
    factors = list(scale_factors) if scale_factors is not None else [None] * (x.ndim - 2)
    for d, (size, factor) in enumerate(zip(out_size, factors, strict=True)):
        in_size = x.shape[2 + d]
        scale = 1.0 / factor if factor is not None else in_size / size
        position = jnp.arange(size, dtype=jnp.float32) + (0.5 if exact else 0.0)
        idx = jnp.minimum(jnp.floor(position * scale).astype(jnp.int32), in_size - 1)
        x = jnp.take(x, idx, axis=2 + d)
    return x
