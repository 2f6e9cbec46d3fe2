"""Wan's RMS norm (``F.normalize`` over channels, times ``sqrt(C)``, a gain and a bias) in fp32, rounding once.

Upstream's `WanRMS_norm` normalises in fp32 for bf16 and fp16 inputs, then
rounds the normalised tensor and multiplies by the scale and the gain in the
input's dtype: three roundings. Here the whole expression runs in fp32 and
is rounded once; in fp32 it is upstream's arithmetic, in the same order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _check(x: jax.Array, gamma: jax.Array, axis: int) -> None:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} out of range for {x.shape=}")
    if gamma.size != x.shape[axis]:
        raise ValueError(f"gamma must hold one gain per channel: {gamma.shape=}, {x.shape=}, {axis=}")


@functools.partial(jax.jit, static_argnames=("axis", "eps"))
def rms_norm(
    x: jax.Array,  # (N, C, ...) with channels on ``axis``
    gamma: jax.Array,  # C gains, in any shape that broadcasts over x (upstream's (C, 1, 1[, 1]))
    bias: jax.Array | float,  # broadcastable to x, or 0.0
    *,
    axis: int = 1,
    eps: float = 1e-12,
) -> jax.Array:  # like x
    """``x / max(||x||_2 over axis, eps) * sqrt(C) * gamma + bias``, in fp32, rounded once to ``x.dtype``."""
    _check(x, gamma, axis)
    xf = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(xf * xf, axis=axis, keepdims=True))
    y = xf / jnp.maximum(norm, eps) * (x.shape[axis] ** 0.5) * gamma.astype(jnp.float32)
    return (y + jnp.asarray(bias, jnp.float32)).astype(x.dtype)


def rms_norm_reference(x: jax.Array, gamma: jax.Array, bias: jax.Array | float, *, axis: int = 1,
                       eps: float = 1e-12) -> jax.Array:
    """The same by `jnp.linalg.norm` and a clip, as torch's ``F.normalize`` words it, for checking `rms_norm`."""
    _check(x, gamma, axis)
    xf = x.astype(jnp.float32)
    norm = jnp.clip(jnp.linalg.norm(xf, axis=axis, keepdims=True), eps, None)
    y = xf / norm * jnp.sqrt(jnp.float32(x.shape[axis])) * gamma.astype(jnp.float32)
    return (y + jnp.asarray(bias, jnp.float32)).astype(x.dtype)
