"""A causal 3-D convolution of frames joined after a frame cache, as one 2-D convolution per time tap.

Wan's `WanCausalConv3d` joins its cache (the previous chunk's last input
frames) before the input, pads the front of time with zeros up to its
causal padding, pads height and width with zeros and runs one 3-D
convolution, valid in time. XLA:CPU runs that 3-D convolution at about half
the speed of the same work as 2-D convolutions (docs/design.md, "Wan on the
CPU: time taps from the cache"). Here time tap ``d`` is one 2-D convolution,
channels-last, of the frames it reads with the kernel slice ``w[:, :, d]``,
the frames folded into the batch; the taps' products are summed in fp32,
the bias added there, and the result cast once. Taps that would read only
the zero frames of the causal padding are not computed (their products are
zero), so a first chunk of one frame is one 2-D convolution, not three.
The result leaves behind an optimization barrier, so the sum is written
once (measured: docs/results/wan-cpu-2026-11-28.md).

Unlike `kernels.causal_conv` (CogVideoX: partial sums carried as the
cache) the cache here is upstream's own, input frames: Wan's blocks take it
from their input before the convolution is called.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def _check(x, cache, weight, bias, time_padding, padding_hw, stride, dilation) -> None:
    if x.ndim != 5 or weight.ndim != 5:
        raise ValueError(f"need 5-D input and weight, got {x.shape=}, {weight.shape=}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"input channels {x.shape[1]} != weight in-channels {weight.shape[1]}")
    if cache is not None and (cache.ndim != 5 or cache.shape[:2] != x.shape[:2] or cache.shape[3:] != x.shape[3:]):
        raise ValueError(f"the cache must be frames of the input's batch, channels and size: {cache.shape=} {x.shape=}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape ({weight.shape[0]},): {bias.shape=}")
    if time_padding < 0 or len(padding_hw) != 2 or len(stride) != 3 or len(dilation) != 3:
        raise ValueError(f"bad geometry: {time_padding=}, {padding_hw=}, {stride=}, {dilation=}")


def _joined(x: jax.Array, cache: jax.Array | None, time_padding: int) -> tuple[jax.Array, int]:
    """The cache joined before ``x`` and how many zero frames go before it (upstream's ``F.pad`` in time).

    Upstream pads the front with ``time_padding - cache frames`` zeros; a
    negative count drops that many frames from the front, as ``F.pad`` does.
    """
    if cache is None:
        return x, time_padding
    joined = jnp.concatenate([cache.astype(x.dtype), x], axis=2)
    front = time_padding - cache.shape[2]
    return (joined, front) if front >= 0 else (joined[:, :, -front:], 0)


@functools.partial(jax.jit, static_argnames=("time_padding", "padding_hw", "stride", "dilation"))
def tap_conv3d(
    x: jax.Array,  # (N, C_in, T, H, W)
    cache: jax.Array | None,  # (N, C_in, T_cache, H, W): frames before x, or None
    weight: jax.Array,  # (C_out, C_in, k_t, k_h, k_w), torch's layout
    bias: jax.Array | None,  # (C_out,) or None
    *,
    time_padding: int,
    padding_hw: tuple[int, int],
    stride: tuple[int, int, int] = (1, 1, 1),
    dilation: tuple[int, int, int] = (1, 1, 1),
) -> jax.Array:  # (N, C_out, T_out, H_out, W_out), x.dtype
    """Upstream's causal convolution of ``x`` after ``cache``, one 2-D convolution per time tap.

    Args:
        x: this chunk's frames, channels second.
        cache: the frames joined before ``x`` (upstream's ``cache_x``), or None.
        weight: the 3-D kernel.
        bias: per-output-channel bias, or None.
        time_padding: the causal padding: zero frames before the joined
            frames, less the cache's frame count (upstream's ``_padding[4]``).
        padding_hw: symmetric zero padding of height and width.
        stride: per (time, height, width).
        dilation: per (time, height, width).

    Returns:
        The convolution in ``x.dtype``, summed and biased in fp32.
    """
    _check(x, cache, weight, bias, time_padding, padding_hw, stride, dilation)
    joined, front = _joined(x, cache, time_padding)
    n, _, frames, _, _ = joined.shape
    c_out, _, k, _, _ = weight.shape
    s, dt = stride[0], dilation[0]
    t_out = (front + frames - dt * (k - 1) - 1) // s + 1
    if t_out < 1:
        raise ValueError(f"no output frame: {front} zero and {frames} joined frames for a time kernel of {k}")
    frames_last = joined.transpose(0, 2, 3, 4, 1)  # (N, T, H, W, C_in)
    acc = None
    for d in range(k):
        # Output t reads padded frame t * s + d * dt: real frame t * s + d * dt - front.
        first = max(0, -(-(front - d * dt) // s))
        if first >= t_out:
            continue  # only zero frames: a zero product
        start = first * s + d * dt - front
        count = t_out - first
        taken = jax.lax.slice_in_dim(frames_last, start, start + (count - 1) * s + 1, stride=s, axis=1)
        product = jax.lax.conv_general_dilated(
            taken.reshape(n * count, *taken.shape[2:]),
            weight[:, :, d].astype(x.dtype).transpose(2, 3, 1, 0),  # HWIO
            window_strides=stride[1:],
            padding=[(p, p) for p in padding_hw],
            rhs_dilation=dilation[1:],
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            preferred_element_type=jnp.float32,
        )
        product = product.reshape(n, count, *product.shape[1:])
        if first:
            product = jnp.pad(product, [(0, 0), (first, 0), (0, 0), (0, 0), (0, 0)])
        acc = product if acc is None else acc + product
    if acc is None:  # every tap reads padding
        h_out, w_out = _hw_out(joined.shape[3:], weight.shape[3:], stride[1:], padding_hw, dilation[1:])
        acc = jnp.zeros((n, t_out, h_out, w_out, c_out), jnp.float32)
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)
    # Behind a barrier XLA writes the sum once, channels-first; without one XLA:CPU adds the taps'
    # fp32 products, transposing, again inside each consumer. XLA:CPU deletes barriers unless the
    # program is compiled with the platform's `keep_barriers` options (the `wan_time_taps` patch asks for them).
    return jax.lax.optimization_barrier(acc.astype(x.dtype).transpose(0, 4, 1, 2, 3))


def _hw_out(hw: Sequence[int], khw: Sequence[int], stride, padding, dilation) -> tuple[int, int]:
    dims = zip(hw, khw, stride, padding, dilation, strict=True)
    return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in dims)


def tap_conv3d_reference(
    x: jax.Array,
    cache: jax.Array | None,
    weight: jax.Array,
    bias: jax.Array | None,
    *,
    time_padding: int,
    padding_hw: tuple[int, int],
    stride: tuple[int, int, int] = (1, 1, 1),
    dilation: tuple[int, int, int] = (1, 1, 1),
) -> jax.Array:
    """Upstream's arithmetic: the cache joined, zero-padded in time, one 3-D convolution, at highest precision."""
    _check(x, cache, weight, bias, time_padding, padding_hw, stride, dilation)
    joined, front = _joined(x, cache, time_padding)
    y = jax.lax.conv_general_dilated(
        joined.astype(jnp.float32),
        weight.astype(jnp.float32),
        window_strides=tuple(stride),
        padding=[(front, 0), *[(p, p) for p in padding_hw]],
        rhs_dilation=tuple(dilation),
        dimension_numbers=("NCDHW", "OIDHW", "NCDHW"),
        precision=jax.lax.Precision.HIGHEST,
    )
    if bias is not None:
        y = y + bias.astype(jnp.float32).reshape(1, -1, 1, 1, 1)
    return y.astype(x.dtype)
