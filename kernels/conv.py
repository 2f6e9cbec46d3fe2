"""Convolution with its bias added inside the fp32 accumulator.

torch's bf16 convolution (oneDNN on CPU, cuDNN on GPU) accumulates in fp32,
adds the bias there and rounds once. torchax lowers ``conv + bias`` as a
bf16 convolution (one rounding) followed by a bf16 add (a second rounding).
Over the decoder's ~30 convolutions that second rounding alone cost about
0.5 dB PSNR against the fp32 decode. Here the convolution returns its fp32
accumulator (``preferred_element_type``), the bias is added in fp32, and the
result is rounded once. The fp32 value only feeds that add and the cast, an
elementwise epilogue XLA fuses into or right behind the convolution.

In fp32 this is exactly ``conv + bias``.

On the CPU the convolution is written channels-last (NDHWC with explicit
transposes around it). Outside loops XLA:CPU inserts the same transposes
itself; inside a `jax.lax.scan` body it does not, and runs a channels-first
convolution ~40x slower (jax-ml/jax#12868; measured here: 128->128 3x3x3 on
4x32x32, 23 s scanned vs 0.55 s unrolled, 0.58 s scanned channels-last).
The frame-batch scan is such a loop. GPU and TPU keep the layout XLA picks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _channels_last_default() -> bool:
    # Decided at trace time from the backend the program is built for.
    return jax.default_backend() == "cpu"


def _dimension_numbers(ndim: int) -> tuple[str, str, str]:
    if ndim - 2 not in _SPATIAL:
        raise ValueError(f"conv needs 3-D to 5-D input (N, C, *spatial), got {ndim=}")
    s = _SPATIAL[ndim - 2]
    return f"NC{s}", f"OI{s}", f"NC{s}"


def _check(x: jax.Array, weight: jax.Array, bias: jax.Array | None, groups: int) -> None:
    if weight.ndim != x.ndim:
        raise ValueError(f"weight rank must match input rank: {x.shape=}, {weight.shape=}")
    if x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"input channels {x.shape[1]} != weight in-channels {weight.shape[1]} x {groups=}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape ({weight.shape[0]},): {bias.shape=}")


@functools.partial(jax.jit, static_argnames=("stride", "padding", "dilation", "groups", "channels_last"))
def conv(
    x: jax.Array,  # (N, C_in, *spatial)
    weight: jax.Array,  # (C_out, C_in // groups, *kernel)
    bias: jax.Array | None,  # (C_out,) or None
    *,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int = 1,
    channels_last: bool | None = None,
) -> jax.Array:  # (N, C_out, *spatial_out), x.dtype
    """`torch.nn.functional.conv{1,2,3}d` with zero padding, rounding once.

    Args:
        x: input, channels second.
        weight: kernel in torch's layout.
        bias: per-output-channel bias, or None.
        stride: per spatial dim.
        padding: symmetric zero padding per spatial dim.
        dilation: per spatial dim.
        groups: feature groups.
        channels_last: compute in channels-last layout; None picks it on
            the CPU backend (see the module docstring). Same result.

    Returns:
        The convolution in ``x.dtype``, accumulated and biased in fp32.
    """
    _check(x, weight, bias, groups)
    if channels_last is None:
        channels_last = _channels_last_default()
    kwargs = dict(
        window_strides=tuple(stride),
        padding=[(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        feature_group_count=groups,
        preferred_element_type=jnp.float32,
    )
    w = weight.astype(x.dtype)
    n = x.ndim
    if channels_last:
        to_last = (0, *range(2, n), 1)  # NC... -> N...C
        lhs, rhs, out = _dimension_numbers(n)
        numbers = (lhs[0] + lhs[2:] + "C", rhs[2:] + "IO", out[0] + out[2:] + "C")
        acc = jax.lax.conv_general_dilated(
            x.transpose(to_last), w.transpose((*range(2, n), 1, 0)), dimension_numbers=numbers, **kwargs
        )
        if bias is not None:
            acc = acc + bias.astype(jnp.float32)
        # Transposed back after the cast: the fp32 accumulator only ever
        # feeds the bias add and the cast.
        return acc.astype(x.dtype).transpose((0, n - 1, *range(1, n - 1)))
    acc = jax.lax.conv_general_dilated(x, w, dimension_numbers=_dimension_numbers(n), **kwargs)
    if bias is not None:
        acc = acc + bias.astype(jnp.float32).reshape((1, -1) + (1,) * (n - 2))
    return acc.astype(x.dtype)


def conv_reference(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    *,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int = 1,
) -> jax.Array:
    """The same convolution with fp32 operands at highest precision, for checking `conv`."""
    _check(x, weight, bias, groups)
    y = jax.lax.conv_general_dilated(
        x.astype(jnp.float32),
        weight.astype(jnp.float32),
        window_strides=tuple(stride),
        padding=[(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        dimension_numbers=_dimension_numbers(x.ndim),
        feature_group_count=groups,
        precision=jax.lax.Precision.HIGHEST,
    )
    if bias is not None:
        y = y + bias.astype(jnp.float32).reshape((1, -1) + (1,) * (x.ndim - 2))
    return y.astype(x.dtype)
