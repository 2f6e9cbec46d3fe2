"""Reflection padding as a zero pad with its borders copied in.

``jnp.pad(mode="reflect")`` is lowered one axis at a time, as a
concatenation of slices, and XLA:GPU writes each concatenation as a copy of
the whole activation: LTX-2's H200 program copied each convolution's input
once per padded axis. A zero pad can be fused into the fusion that produces
the input, and the reflected borders are then copied in place, a row or
column at a time (each read from inside the padded array, axis by axis,
so the corners reflect in both). Same values as ``jnp.pad``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def _check(x: jax.Array, pads: Sequence[int]) -> None:
    if len(pads) > x.ndim:
        raise ValueError(f"{len(pads)} pads for a {x.ndim}-D array")
    for n, p in zip(x.shape[x.ndim - len(pads) :], pads, strict=True):
        if not 0 <= p < n:
            raise ValueError(f"reflection padding needs 0 <= pad < size, got pad {p} for size {n}")


def reflect_pad(x: jax.Array, pads: Sequence[int]) -> jax.Array:
    """``x`` padded by reflection on its last ``len(pads)`` axes, ``pads[i]`` on both sides of each.

    Raises:
        ValueError: a pad not below its axis' size (no reflection exists).
    """
    _check(x, pads)
    first = x.ndim - len(pads)
    widths = [(0, 0, 0)] * first + [(p, p, 0) for p in pads]
    out = jax.lax.pad(x, jnp.zeros((), x.dtype), widths)
    for axis, p in enumerate(pads, start=first):
        size = out.shape[axis]
        for k in range(p):
            # Border k from each edge mirrors the row k + 1 inside the data on that side.
            out = _set(out, axis, p - 1 - k, _take(out, axis, p + 1 + k))
            out = _set(out, axis, size - p + k, _take(out, axis, size - p - 2 - k))
    return out


def _take(x: jax.Array, axis: int, index: int) -> jax.Array:
    return jax.lax.slice_in_dim(x, index, index + 1, axis=axis)


def _set(x: jax.Array, axis: int, index: int, row: jax.Array) -> jax.Array:
    start = [0] * x.ndim
    start[axis] = index
    return jax.lax.dynamic_update_slice(x, row, start)


def reflect_pad_reference(x: jax.Array, pads: Sequence[int]) -> jax.Array:
    """``jnp.pad(mode="reflect")`` on the last ``len(pads)`` axes, for checking `reflect_pad`."""
    _check(x, pads)
    first = x.ndim - len(pads)
    return jnp.pad(x, [(0, 0)] * first + [(p, p) for p in pads], mode="reflect")
