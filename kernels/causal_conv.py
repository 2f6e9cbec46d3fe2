"""A causal 3-D convolution over frame batches, as one 2-D convolution per time tap.

Upstream's `CogVideoXCausalConv3d` prepends a conv cache (the previous
batch's last ``k - 1`` input frames, or ``k - 1`` copies of the first frame)
and runs a 3-D convolution, valid in time. On XLA:CPU that is slow: the
same work as 2-D convolutions summed runs about 1.5x faster (docs/design.md,
"CPU convolutions: time taps").

Here time tap ``d`` is a 2-D convolution of the batch's own frames with the
kernel slice ``w[:, :, d]``: ``A_d[j] = x_j * w_d``. Frame ``j``'s tap-``d``
product lands in output ``j + k - 1 - d``. The products that land past the
batch's end belong to the next batch's first ``k - 1`` outputs, and they are
exactly what the next batch would recompute from the cache upstream carries.
So instead of input frames the carried state is those partial sums: the
next batch's first ``k - 1`` output frames, bias excluded, in fp32.

Every frame is convolved once per tap, as upstream's padded convolution
does, so XLA's FLOP count is the analytic one. No padded copy of the input
is built either.

The state is opaque to upstream's code, which only hands a module's cache
back to the same module. Its layout is channels-last, fp32:
``(N, k - 1, H_out, W_out, C_out)``.

With ``cache_inputs`` the carried state is upstream's own cache instead,
the batch's last ``k - 1`` input frames ``(N, C_in, k - 1, H, W)``, and the
partial sums are rebuilt from it when the next batch starts (2-D
convolutions of ``k - 1`` frames, ~1/8 of an 8-frame batch's). That is
smaller when ``C_in < C_out``: the encoder's ``conv_in`` (3 -> 128
channels at full resolution) carries 3 channels instead of 128.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def _check(x: jax.Array, weight: jax.Array, bias: jax.Array | None, padding_hw: Sequence[int]) -> None:
    if x.ndim != 5 or weight.ndim != 5:
        raise ValueError(f"need 5-D input and weight, got {x.shape=}, {weight.shape=}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"input channels {x.shape[1]} != weight in-channels {weight.shape[1]}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape ({weight.shape[0]},): {bias.shape=}")
    if weight.shape[2] < 2:
        raise ValueError(f"a time kernel of 1 has no cache to carry: {weight.shape=}")
    if len(padding_hw) != 2:
        raise ValueError(f"padding_hw must give (height, width) padding, got {padding_hw!r}")


def state_shape(x_shape: Sequence[int], weight_shape: Sequence[int], padding_hw: Sequence[int]) -> tuple[int, ...]:
    """Shape of the carried state for input ``x_shape`` (N, C, T, H, W), stride 1."""
    n, _, _, h, w = x_shape
    c_out, _, kt, kh, kw = weight_shape
    return (n, kt - 1, h + 2 * padding_hw[0] - kh + 1, w + 2 * padding_hw[1] - kw + 1, c_out)


@functools.partial(jax.jit, static_argnames=("padding_hw", "cache_inputs", "in_order"))
def causal_conv3d(
    x: jax.Array,  # (N, C_in, T, H, W)
    state: jax.Array | None,  # (N, k - 1, H_out, W_out, C_out) fp32, (N, C_in, k - 1, H, W) with cache_inputs, or None
    weight: jax.Array,  # (C_out, C_in, k, kh, kw), torch's layout
    bias: jax.Array | None,  # (C_out,) or None
    *,
    padding_hw: tuple[int, int],
    cache_inputs: bool = False,
    in_order: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """One frame batch of a causal convolution (stride 1, zero padding in H and W).

    Args:
        x: this batch's frames, channels second.
        state: the previous batch's returned state; None for the first
            batch, whose cache upstream fills with copies of the first frame.
        weight: the 3-D kernel.
        bias: per-output-channel bias, or None.
        padding_hw: symmetric zero padding of height and width.
        cache_inputs: carry upstream's cache (the last ``k - 1`` input
            frames, ``x.dtype``) instead of the fp32 partial sums.
        in_order: add each addend (the previous state, then each tap's
            product) into the output before the next tap is computed, and
            transpose each tap's kernel slice only then. Left free, a
            scheduler may keep the carried state alive through the whole
            convolution, two products alive at once, or every kernel
            slice transposed when the convolution starts.

    Returns:
        ``(output, state)``: the output (N, C_out, T, H_out, W_out) in
        ``x.dtype``, equal to upstream's padded convolution, and the state
        for the next batch.
    """
    _check(x, weight, bias, padding_hw)
    n, _, t = x.shape[:3]
    k = weight.shape[2]
    xl = x.transpose(0, 2, 3, 4, 1).reshape(n * t, *x.shape[3:], x.shape[1])  # (N*T, H, W, C)
    # Materialised behind a barrier: with width sharding, the partitioner's
    # halo exchange otherwise re-reads the producers of x (SpatialNorm's
    # full-size scale and shift), which then have two consumers and stay
    # alive: 2.45 -> 2.12 GiB per device at tp=8 (2b, 49 frames at 480x720,
    # fp32, memory-aware scheduler). XLA:CPU keeps it only with
    # `patches.KEEP_BARRIERS_COMPILER_OPTIONS`; one device is unchanged.
    # The kernel goes behind it too, so that its per-tap slices are
    # transposed when this conv runs, not all at the start of a scan step.
    w = weight.astype(x.dtype)
    if cache_inputs:
        next_cache = _last_inputs(x, state, k)
        if state is not None:
            # Behind the same barrier as x, so the sums are rebuilt when this
            # batch runs, not hoisted to the start of a scan step.
            xl, state, w = jax.lax.optimization_barrier((xl, state, w))
            state = _sums_of_inputs(state, w, padding_hw)
        else:
            xl, w = jax.lax.optimization_barrier((xl, w))
    else:
        xl, w = jax.lax.optimization_barrier((xl, w))

    def tap(d: int) -> jax.Array:  # (N, T, H_out, W_out, C_out), fp32
        a = jax.lax.conv_general_dilated(
            xl,
            w[:, :, d].transpose(2, 3, 1, 0),
            window_strides=(1, 1),
            padding=[(p, p) for p in padding_hw],
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            preferred_element_type=jnp.float32,
        )
        return a.reshape(n, t, *a.shape[1:])

    # Output frames [0, T) and the next state, frames [T, T + k - 1) of the
    # same extended sequence, are accumulated tap by tap, in place: the
    # first tap's product is the output's buffer, the tail is first built
    # from the frames that land in it (no zero-filled buffer, which XLA
    # would share between convs and copy before each update), and each
    # later product dies as soon as it is added.
    out, tail = tap(k - 1), None  # lands at offset 0
    if state is not None:
        out, tail = _add_frames(out, tail, state.astype(jnp.float32), 0, k - 1)
    for d in range(k - 2, -1, -1):
        if in_order:
            out, tail, xl, w = jax.lax.optimization_barrier((out, tail, xl, w))
        a = tap(d)
        out, tail = _add_frames(out, tail, a, k - 1 - d, k - 1)
        if state is None:
            # Upstream's first cache is k - 1 copies of frame 0: through tap
            # d they land at 0 .. k-2-d.
            out, tail = _add_frames(out, tail, jnp.repeat(a[:, :1], k - 1 - d, axis=1), 0, k - 1)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(x.dtype).transpose(0, 4, 1, 2, 3), next_cache if cache_inputs else tail


def _last_inputs(x: jax.Array, cache: jax.Array | None, k: int) -> jax.Array:
    """Upstream's next cache: the last ``k - 1`` frames of the cache-padded input (N, C_in, k - 1, H, W)."""
    if x.shape[2] >= k - 1:
        return x[:, :, x.shape[2] - (k - 1) :]
    before = jnp.repeat(x[:, :, :1], k - 1, axis=2) if cache is None else cache.astype(x.dtype)
    return jnp.concatenate([before, x], axis=2)[:, :, -(k - 1) :]


def _sums_of_inputs(cache: jax.Array, w: jax.Array, padding_hw: Sequence[int]) -> jax.Array:
    """The partial sums ``causal_conv3d`` would have carried after a batch ending in ``cache``'s frames.

    Frame ``j`` of the ``k - 1`` cached frames reaches the next batch's
    output ``j - d`` through tap ``d <= j``; the sums are accumulated in
    the order `causal_conv3d` accumulates its tail.
    """
    n, _, m = cache.shape[:3]  # m = k - 1
    cl = cache.transpose(0, 2, 3, 4, 1)  # (N, k - 1, H, W, C)
    tail = None
    for d in range(m - 1, -1, -1):
        frames = cl[:, d:].reshape(n * (m - d), *cl.shape[2:])
        a = jax.lax.conv_general_dilated(
            frames,
            w[:, :, d].transpose(2, 3, 1, 0),
            window_strides=(1, 1),
            padding=[(p, p) for p in padding_hw],
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            preferred_element_type=jnp.float32,
        )
        a = a.reshape(n, m - d, *a.shape[1:])
        if tail is None:
            tail = jnp.pad(a, [(0, 0), (0, d)] + [(0, 0)] * (a.ndim - 2))
        else:
            tail = tail.at[:, : m - d].add(a)
    return tail


def _add_frames(
    out: jax.Array, tail: jax.Array | None, piece: jax.Array, start: int, tail_frames: int
) -> tuple[jax.Array, jax.Array | None]:
    """Adds ``piece`` at frames [start, start + L) of ``out`` (T frames) then ``tail`` (``tail_frames``).

    A ``tail`` of None is all zeros; the first piece landing in it makes it,
    zero-padded to ``tail_frames``.
    """
    t, length = out.shape[1], piece.shape[1]
    head = max(0, min(length, t - start))
    if head:
        out = out.at[:, start : start + head].add(piece[:, :head])
    if head < length:
        begin, part = start + head - t, piece[:, head:]
        if tail is None:
            after = tail_frames - begin - part.shape[1]
            tail = jnp.pad(part, [(0, 0), (begin, after)] + [(0, 0)] * (part.ndim - 2))
        else:
            tail = tail.at[:, begin : begin + part.shape[1]].add(part)
    return out, tail


def causal_conv3d_reference(
    x: jax.Array,
    cache: jax.Array | None,  # (N, C_in, k - 1, H, W): upstream's cache of input frames
    weight: jax.Array,
    bias: jax.Array | None,
    *,
    padding_hw: tuple[int, int],
) -> tuple[jax.Array, jax.Array]:
    """Upstream's formulation at fp32 HIGHEST precision: pad with the cache, convolve, keep the last frames.

    Returns:
        ``(output, cache)``, the cache being the last ``k - 1`` padded input frames.
    """
    _check(x, weight, bias, padding_hw)
    k = weight.shape[2]
    if cache is None:
        cache = jnp.repeat(x[:, :, :1], k - 1, axis=2)
    padded = jnp.concatenate([cache.astype(x.dtype), x], axis=2)
    y = jax.lax.conv_general_dilated(
        padded.astype(jnp.float32),
        weight.astype(jnp.float32),
        window_strides=(1, 1, 1),
        padding=[(0, 0), *((p, p) for p in padding_hw)],
        dimension_numbers=("NCDHW", "OIDHW", "NCDHW"),
        precision=jax.lax.Precision.HIGHEST,
    )
    if bias is not None:
        y = y + bias.astype(jnp.float32).reshape(1, -1, 1, 1, 1)
    return y.astype(x.dtype), padded[:, :, -(k - 1) :]
