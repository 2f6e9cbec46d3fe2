"""Convolution by the host's torch inside an XLA:CPU program: oneDNN's kernels, the program's own buffers.

On the project's 2-core x86 machine XLA:CPU's 3-D convolutions of fewer than
1024 channels take up to 6x the time of oneDNN's, which torch's CPU
convolution calls (LTX-2's decoder, fp32: 3x3x3 128 -> 48 on 11 x 34x50, 93 ms
against 15; docs/results/ltx2-cpu-host-conv-2026-12-08.md). `jax.experimental.buffer_callback`
hands torch the program's input buffers without a copy; torch writes the
result into the output buffer (one copy of the output). The call is a custom
call XLA cannot partition or fuse, so it is for a one-device CPU program
(`cogvideox_torchax.families.ltx2.patches.host_conv` decides where). Checked against
`kernels.conv.conv_reference`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import torch
import torch.nn.functional as F
from jax.experimental.buffer_callback import buffer_callback

_TORCH_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def _tensor(buffer) -> torch.Tensor:
    # The program's buffer itself (DLPack), not a copy.
    return torch.from_dlpack(buffer)


def _run(ctx, out, x, weight, *bias, stride, padding, dilation, groups) -> None:
    # Plain torch on CPU tensors whatever torch modes the calling thread has
    # on (a torchax environment around the call would take these ops).
    with torch.no_grad(), torch.utils._python_dispatch._disable_current_modes(), torch._C.DisableTorchFunction():
        try:
            y = _TORCH_CONV[x.ndim](
                _tensor(x), _tensor(weight), _tensor(bias[0]) if bias else None, stride, padding, dilation, groups
            )
        except (MemoryError, RuntimeError) as e:
            if not isinstance(e, MemoryError) and "DefaultCPUAllocator" not in str(e):
                raise
            # XLA passes the callback's error on as text. Worded as XLA words its own ("out of memory"),
            # the callers' out-of-memory rule (a smaller plan, exit 3) takes it.
            raise MemoryError(f"out of memory in the host's convolution of {tuple(x.shape)}: {e}") from e
        _tensor(out).copy_(y)


def host_conv(
    x: jax.Array,  # (N, C_in, *spatial)
    weight: jax.Array,  # (C_out, C_in // groups, *kernel)
    bias: jax.Array | None,  # (C_out,) or None
    *,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int = 1,
) -> jax.Array:  # (N, C_out, *spatial_out), x.dtype
    """`torch.nn.functional.conv{1,2,3}d` with zero padding, run by the host's torch on the program's buffers.

    For an XLA:CPU program (a GPU's buffers are not the host's). Same
    arguments as `kernels.conv.conv`; the result is torch's, bit for bit.

    Raises:
        ValueError: ``x`` is not 3-D to 5-D, or the weight or bias does
            not fit it.
    """
    if x.ndim not in _TORCH_CONV:
        raise ValueError(f"host_conv needs 3-D to 5-D input (N, C, *spatial), got {x.shape=}")
    if weight.ndim != x.ndim or x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"weight {weight.shape} does not fit input {x.shape} with {groups=}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape ({weight.shape[0]},): {bias.shape=}")
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    weight = weight.astype(x.dtype)
    # The result's shape as XLA's own convolution of the same arguments would have it.
    out = jax.eval_shape(
        functools.partial(jax.lax.conv_general_dilated, window_strides=stride, padding=[(p, p) for p in padding],
                          rhs_dilation=dilation, feature_group_count=groups),
        x, weight,
    )
    run = functools.partial(_run, stride=stride, padding=padding, dilation=dilation, groups=groups)
    # "sequential": under vmap, one call per element (torch's convolution takes one batch axis).
    call = buffer_callback(run, out, vmap_method="sequential")
    return call(x, weight) if bias is None else call(x, weight, bias.astype(x.dtype))
