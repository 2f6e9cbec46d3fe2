"""Convolution with its bias added inside the fp32 accumulator.

torch's bf16 convolution (oneDNN on CPU, cuDNN on GPU) accumulates in fp32,
adds the bias there and rounds once. torchax lowers ``conv + bias`` as a
bf16 convolution (one rounding) followed by a bf16 add (a second rounding).
Over the decoder's ~30 convolutions that second rounding alone cost about
0.5 dB PSNR against the fp32 decode. Here the convolution returns its fp32
accumulator (``preferred_element_type``), the bias is added in fp32, and the
result is rounded once. On XLA:CPU the fp32 value only feeds that add and
the cast, an elementwise epilogue fused right behind the convolution. On a
GPU it is not fused: cuDNN writes the fp32 accumulator out in full, and a
bf16 256->128 3x3x3 conv on (1,256,11,768,1360) took 78 ms with fp32
output against 35 ms with bf16 output (an H100 run reported to the project; docs/accelerators.md). So the bias goes
into the accumulator only where a `ConvPolicy` says so (``bias_in_fp32``).

In fp32 both ways are exactly ``conv + bias``.

On the CPU the convolution is written channels-last (NDHWC with explicit
transposes around it). Outside loops XLA:CPU inserts the same transposes
itself; inside a `jax.lax.scan` body it does not, and runs a channels-first
convolution ~40x slower (jax-ml/jax#12868; measured here: 128->128 3x3x3 on
4x32x32, 23 s scanned vs 0.55 s unrolled, 0.58 s scanned channels-last).
The frame-batch scan is such a loop.

What differs per backend is one `ConvPolicy` (chosen by
`cogvideox_torchax.platforms.run_plan`): the layout, where a bf16 or fp16 bias is added, and the
largest operand a convolution may have before it is split; a family's CPU patch may send a
convolution to the host's torch instead (``host``: `kernels.host_conv`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from cogvideox_torchax.kernels.host_conv import host_conv

_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


@dataclasses.dataclass(frozen=True)
class ConvPolicy:
    """How `conv` runs on one backend; the static arguments it takes besides the shapes.

    Attributes:
        channels_last: compute in channels-last layout (explicit transposes
            around the convolution). Same result.
        bias_in_fp32: add the bias to the fp32 accumulator and round once;
            False lets the convolution itself emit ``x.dtype`` and adds the
            bias after (a second rounding in bf16 or fp16, no fp32 activation).
            Identical in fp32.
        fused_bias: with ``bias_in_fp32``, lower for CUDA as ``conv(x.dtype)
            + bias``, which XLA fuses into cuDNN's fp32 conv-bias epilogue
            (the same single rounding, no fp32 activation); other platforms
            get the explicit fp32 form (`jax.lax.platform_dependent`).
        max_elements: split a convolution whose input or output would hold
            more elements than this into several along the batch or the
            first spatial axis (with its halo); None never splits.
        host: run it by the host's torch (`kernels.host_conv`: oneDNN on
            x86) on the program's buffers, channels-first as upstream holds
            them, for a one-device XLA:CPU program; the layout and bias
            fields do not apply (oneDNN adds the bias to its fp32
            accumulator and rounds once).
    """

    channels_last: bool = False
    bias_in_fp32: bool = True
    fused_bias: bool = False
    max_elements: int | None = None
    host: bool = False

    def __post_init__(self) -> None:
        if self.max_elements is not None and (not isinstance(self.max_elements, int) or self.max_elements < 1):
            raise ValueError(f"max_elements must be a positive int or None, got {self.max_elements!r}")

    def kwargs(self) -> dict[str, object]:
        """The keyword arguments of `conv` this policy sets."""
        return dataclasses.asdict(self)


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


@functools.partial(
    jax.jit,
    static_argnames=(
        "stride", "padding", "dilation", "groups", "channels_last", "bias_in_fp32", "fused_bias", "max_elements",
        "host",
    ),
)
def conv(
    x: jax.Array,  # (N, C_in, *spatial)
    weight: jax.Array,  # (C_out, C_in // groups, *kernel)
    bias: jax.Array | None,  # (C_out,) or None
    *,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int = 1,
    channels_last: bool = False,
    bias_in_fp32: bool = True,
    fused_bias: bool = False,
    max_elements: int | None = None,
    host: bool = False,
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
        channels_last: see `ConvPolicy`.
        bias_in_fp32: see `ConvPolicy`.
        fused_bias: see `ConvPolicy`.
        max_elements: see `ConvPolicy`.
        host: see `ConvPolicy`.

    Returns:
        The convolution in ``x.dtype``, accumulated in fp32 (biased there
        too with ``bias_in_fp32``).
    """
    _check(x, weight, bias, groups)
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    one = functools.partial(
        _conv_one,
        weight=weight,
        bias=bias,
        stride=stride,
        dilation=dilation,
        groups=groups,
        channels_last=channels_last,
        bias_in_fp32=bias_in_fp32,
        fused_bias=fused_bias,
        host=host,
    )
    out_shape = _out_shape(x.shape, weight.shape, stride, padding, dilation)
    if max_elements is None or max(math.prod(x.shape), math.prod(out_shape)) <= max_elements:
        return one(x, padding=padding)
    return _split(x, out_shape, weight.shape, stride, padding, dilation, max_elements, one)


def _out_shape(x_shape, w_shape, stride, padding, dilation) -> tuple[int, ...]:
    spatial = tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(x_shape[2:], w_shape[2:], stride, padding, dilation, strict=True)
    )
    return (x_shape[0], w_shape[0], *spatial)


def _split(x, out_shape, w_shape, stride, padding, dilation, max_elements, one) -> jax.Array:
    """Runs ``one`` on pieces of ``x`` whose inputs and outputs hold at most ``max_elements`` each.

    cuDNN's convolutions crawl (or fail) once an operand reaches 2^31
    elements; upstream's `CogVideoXSafeConv3d` chunks in time for the same
    reason. Pieces go along the batch when one sample fits, else along the
    first spatial axis (time for the 3-D convs) with its halo of
    ``dilation * (kernel - 1)`` input rows, and where one row of that axis
    is still too large (a frame above 2^28 elements at the GPU plan's chunk
    size), each row along the next axis in turn. Each piece is the same
    arithmetic as the whole, so the result is unchanged.
    """
    n = x.shape[0]
    per_sample = max(math.prod(x.shape[1:]), math.prod(out_shape[1:]))
    if n > 1:
        size = max(1, max_elements // per_sample)
        pieces = []
        for i in range(0, n, size):
            piece = x[i : i + size]
            if per_sample * piece.shape[0] <= max_elements:
                pieces.append(one(piece, padding=padding))
            else:
                piece_out = (piece.shape[0], *out_shape[1:])
                pieces.append(_split(piece, piece_out, w_shape, stride, padding, dilation, max_elements, one))
        return jnp.concatenate(pieces, axis=0)
    return _split_spatial(x, out_shape, w_shape, stride, padding, dilation, max_elements, one, 0)


def _split_spatial(x, out_shape, w_shape, stride, padding, dilation, max_elements, one, axis) -> jax.Array:
    # Pieces along spatial axis ``axis``: its padding is applied here, once,
    # so that every piece is a plain valid slice along it.
    dim = 2 + axis
    if padding[axis]:
        x = jnp.pad(x, [(padding[axis], padding[axis]) if i == dim else (0, 0) for i in range(x.ndim)])
    padding = tuple(0 if i == axis else p for i, p in enumerate(padding))
    s, d, k = stride[axis], dilation[axis], w_shape[dim]
    rows_out = out_shape[dim]
    in_row = math.prod(x.shape) // x.shape[dim]
    out_row = math.prod(out_shape) // rows_out

    def too_big(size: int) -> bool:
        return max(((size - 1) * s + d * (k - 1) + 1) * in_row, size * out_row) > max_elements

    size = rows_out
    while size > 1 and too_big(size):
        size -= 1
    finer = too_big(size) and axis + 1 < x.ndim - 2
    if too_big(size) and not finer:
        raise ValueError(
            f"cannot split a convolution of {x.shape=}, weight {tuple(w_shape)} below {max_elements=} elements"
        )
    pieces = []
    for a in range(0, rows_out, size):
        b = min(a + size, rows_out)
        piece = jax.lax.slice_in_dim(x, a * s, (b - 1) * s + d * (k - 1) + 1, axis=dim)
        if finer:
            piece_out = tuple(b - a if i == dim else n for i, n in enumerate(out_shape))
            pieces.append(
                _split_spatial(piece, piece_out, w_shape, stride, padding, dilation, max_elements, one, axis + 1)
            )
        else:
            pieces.append(one(piece, padding=padding))
    return jnp.concatenate(pieces, axis=dim)


def _conv_one(
    x: jax.Array,
    *,
    weight: jax.Array,
    bias: jax.Array | None,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    channels_last: bool,
    bias_in_fp32: bool,
    fused_bias: bool = False,
    host: bool = False,
) -> jax.Array:
    if host:
        return host_conv(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if fused_bias and bias_in_fp32 and bias is not None and x.dtype != jnp.float32:
        # The compiler's fusion does on CUDA what the explicit form does elsewhere.
        kwargs = dict(weight=weight, stride=stride, padding=padding, dilation=dilation, groups=groups,
                      channels_last=channels_last)
        return jax.lax.platform_dependent(
            x,
            bias,
            cuda=lambda x, b: _conv_one(x, bias=b, bias_in_fp32=False, **kwargs),
            default=lambda x, b: _conv_one(x, bias=b, bias_in_fp32=True, **kwargs),
        )
    acc_dtype = jnp.float32 if bias_in_fp32 else None
    bias_dtype = jnp.float32 if bias_in_fp32 else x.dtype
    kwargs = dict(
        window_strides=stride,
        padding=[(p, p) for p in padding],
        rhs_dilation=dilation,
        feature_group_count=groups,
        preferred_element_type=acc_dtype,
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
            acc = acc + bias.astype(bias_dtype)
        # Transposed back after the cast: the fp32 accumulator only ever
        # feeds the bias add and the cast.
        return acc.astype(x.dtype).transpose((0, n - 1, *range(1, n - 1)))
    acc = jax.lax.conv_general_dilated(x, w, dimension_numbers=_dimension_numbers(n), **kwargs)
    if bias is not None:
        acc = acc + bias.astype(bias_dtype).reshape((1, -1) + (1,) * (n - 2))
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
