"""GroupNorm with fp32 statistics and no full-size fp32 copy of the input.

torch's GroupNorm on a bf16 activation computes in fp32; a naive JAX port does
``x.astype(float32)`` first and keeps that full-size copy alive (a bf16
decode written that way runs out of memory because of exactly this). Here the
fp32 conversion only ever feeds a reduction (fused into the reduce) or the
normalisation's elementwise chain, which ends in the cast back to the input
dtype and is fused into one pass: fp32 values live in registers only.

Statistics are two-pass (mean, then mean of squared deviations), not
``E[x^2] - E[x]^2``: the one-pass form cancels catastrophically when an
activation's mean is large against its spread, and both passes fuse anyway.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _check(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, num_groups: int) -> None:
    if x.ndim < 2:
        raise ValueError(f"group_norm needs (N, C, ...) input, got {x.shape=}")
    channels = x.shape[1]
    if num_groups <= 0 or channels % num_groups:
        raise ValueError(f"channels must divide into groups: {x.shape=}, {num_groups=}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != (channels,):
            raise ValueError(f"{name} must have shape ({channels},): {p.shape=}, {x.shape=}")


@functools.partial(jax.jit, static_argnames=("num_groups", "eps"))
def group_norm(
    x: jax.Array,  # (N, C, *spatial), any float dtype
    weight: jax.Array | None,  # (C,) or None
    bias: jax.Array | None,  # (C,) or None
    *,
    num_groups: int,
    eps: float = 1e-5,
) -> jax.Array:  # (N, C, *spatial), x.dtype
    """Group normalisation matching `torch.nn.functional.group_norm`.

    Args:
        x: activation, channels second; 4-D (NCHW) and 5-D (NCTHW) are the
            cases the VAE uses, any rank >= 2 works.
        weight: per-channel scale, or None for 1.
        bias: per-channel shift, or None for 0.
        num_groups: number of channel groups; must divide ``C``.
        eps: added to the variance.

    Returns:
        The normalised activation in ``x.dtype``.
    """
    _check(x, weight, bias, num_groups)
    mean_c, inv_std_c = group_norm_statistics(x, num_groups=num_groups, eps=eps)
    return group_norm_apply(x, mean_c, inv_std_c, weight, bias)


@functools.partial(jax.jit, static_argnames=("num_groups", "eps", "by_frame"))
def group_norm_statistics(
    x: jax.Array,  # (N, C, T, *spatial) with by_frame, else (N, C, *spatial); any float dtype
    *,
    num_groups: int,
    eps: float = 1e-5,
    by_frame: bool = False,
) -> tuple[jax.Array, jax.Array]:  # (N, C) f32 each
    """Per-channel fp32 mean and ``1 / sqrt(var + eps)`` of ``x``'s groups (`group_norm`'s statistics).

    With `group_norm_apply` on any part of ``x`` (a time range, say) this
    gives `group_norm`'s values there. ``by_frame`` sums each frame (axis
    2) apart and then the frames, both passes: the same statistics up to
    fp32 summation order, and no reduction reads more than one frame, so
    when ``x`` is a concatenation of time chunks XLA reads the chunks where
    they are instead of storing ``x`` whole for the second pass.
    """
    _check(x, None, None, num_groups)
    n, c = x.shape[:2]
    f32 = jnp.float32
    parts = [x[:, :, t : t + 1] for t in range(x.shape[2])] if by_frame else [x]
    grouped = [p.reshape(n, num_groups, c // num_groups, *p.shape[2:]) for p in parts]
    axes = tuple(range(2, grouped[0].ndim))
    count = x.size // (n * num_groups)
    # Both reductions read x in its own dtype and widen element by element
    # inside the reduce; no fp32 array of x's size is ever stored.
    mean = sum(jnp.sum(g, axis=axes, dtype=f32, keepdims=True) for g in grouped) / count
    var = sum(jnp.sum(jnp.square(g.astype(f32) - mean), axis=axes, keepdims=True) for g in grouped) / count
    inv_std = jax.lax.rsqrt(var + eps)  # (n, G, 1, ...)
    per_channel = functools.partial(jnp.repeat, repeats=c // num_groups, axis=1)
    return per_channel(mean.reshape(n, num_groups)), per_channel(inv_std.reshape(n, num_groups))


@jax.jit
def group_norm_apply(
    x: jax.Array,  # (N, C, *spatial), any float dtype
    mean_c: jax.Array,  # (N, C) f32, from group_norm_statistics
    inv_std_c: jax.Array,  # (N, C) f32
    weight: jax.Array | None,  # (C,) or None
    bias: jax.Array | None,  # (C,) or None
) -> jax.Array:  # (N, C, *spatial), x.dtype
    """``(x - mean) * inv_std * weight + bias`` per channel, in fp32, rounded once to ``x.dtype``."""
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    if mean_c.shape != (n, c) or inv_std_c.shape != (n, c):
        raise ValueError(f"statistics must be (N, C): {x.shape=}, {mean_c.shape=}, {inv_std_c.shape=}")
    f32 = jnp.float32
    # Per (n, c): y = (x - mean) * scale + b, in fp32, rounded once to
    # x's dtype as torch does. Not folded into x * scale + (b - mean * scale):
    # that cancels catastrophically when the mean is large against the
    # spread. The fp32 values here are one elementwise chain from x to the
    # final cast, which XLA fuses into a single pass: nothing fp32 of x's size
    # is stored. (Doing the subtract and multiply-add in bf16 instead rounds
    # three times and cost 0.5 dB PSNR over the decoder.)
    w = jnp.ones((c,), f32) if weight is None else weight.astype(f32)
    b = jnp.zeros((c,), f32) if bias is None else bias.astype(f32)
    scale = inv_std_c * w
    bcast = (n, c) + (1,) * len(spatial)
    y = (x.astype(f32) - mean_c.reshape(bcast)) * scale.reshape(bcast) + b.reshape(1, c, *(1,) * len(spatial))
    return y.astype(x.dtype)


def group_norm_reference(
    x: jax.Array,  # (N, C, *spatial)
    weight: jax.Array | None,  # (C,) or None
    bias: jax.Array | None,  # (C,) or None
    *,
    num_groups: int,
    eps: float = 1e-5,
) -> jax.Array:  # (N, C, *spatial), x.dtype
    """The textbook formula, entirely in fp32, for checking `group_norm`."""
    _check(x, weight, bias, num_groups)
    n, c = x.shape[:2]
    xf = x.astype(jnp.float32).reshape(n, num_groups, -1)
    mean = xf.mean(axis=-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((xf - mean) / jnp.sqrt(var + eps)).reshape(x.shape)
    bcast = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.astype(jnp.float32).reshape(bcast)
    if bias is not None:
        y = y + bias.astype(jnp.float32).reshape(bcast)
    return y.astype(x.dtype)
