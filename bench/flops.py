"""The convolution work of a decode, counted from shapes alone.

XLA's ``cost_analysis`` is not a FLOP count one can rely on everywhere: on
GPU it counts about nothing for the convolutions it hands to cuDNN (0.9
GFLOP against 670 real at (1,16,3,8,8) on an H100). The bench therefore
counts the convolutions itself, from upstream's own decode: a forward hook on
every convolution adds up the multiply-adds of its call.

The count needs shapes only, so it runs upstream's decode on torch's
``meta`` device (module and latents on meta: no data, no arithmetic), which
is instant at any size, where a real fp32 decode at (1,16,21,96,170) would
take a CPU hours. `count_conv_flops` also runs on real data; the tests check
that both give the same number.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.inputs import decode_args


def valid_taps(n: int, k: int, p: int | tuple[int, int], s: int, d: int) -> int:
    """Kernel taps that land inside an input of length ``n``, summed over all outputs of one dim.

    ``p``: zero padding on both sides, or ``(before, after)``.
    """
    before, after = (p, p) if isinstance(p, int) else p
    out = (n + before + after - d * (k - 1) - 1) // s + 1
    return sum(1 for o in range(out) for t in range(k) if 0 <= o * s - before + t * d < n)


def _dims(conv: torch.nn.Module, args: tuple, kwargs: dict) -> list[tuple[int, tuple[int, int]]]:
    """Per spatial dim of a convolution's call: the length of real data and its zero padding ``(before, after)``.

    A convolution that pads its input itself before convolving keeps that
    padding in ``_padding``, in ``F.pad``'s order (last dim first), and
    joins a cache of earlier frames (its second argument) before its input
    where it pads time (Wan's ``WanCausalConv3d``): the cache frames are
    real data, the zero frames that make up the rest are not.
    """
    x = args[0]
    own = getattr(conv, "_padding", None)
    if own is None:
        return [(n, (p, p)) for n, p in zip(x.shape[2:], conv.padding, strict=True)]
    pads = [(own[2 * i], own[2 * i + 1]) for i in range(len(own) // 2)][::-1]  # first spatial dim first
    cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
    dims = [(n, pad) for n, pad in zip(x.shape[2:], pads, strict=True)]
    if cache is not None and pads[0][0] > 0:
        n, (before, after) = dims[0]
        joined = n + cache.shape[2]
        # F.pad with a negative count drops frames from the front.
        dims[0] = (joined + min(0, before - cache.shape[2]), (max(0, before - cache.shape[2]), after))
    return dims


def count_conv_flops(module: torch.nn.Module, z: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Runs ``module.decode(z, *inputs)`` and counts the FLOPs of every convolution it calls.

    2 FLOPs per multiply-add whose input is real data, not zero padding (the
    count XLA's cost analysis makes too; causal time padding is real frames
    and counts). Bias adds are not counted. This is the work the decode must
    do; XLA's count of ours also holds the elementwise ops and any waste.

    Returns:
        the decoded sample (on ``z``'s device) and the FLOP count.
    """
    total = 0

    def count(conv, args, kwargs, output):
        nonlocal total
        dims = zip(_dims(conv, args, kwargs), conv.kernel_size, conv.stride, conv.dilation, strict=True)
        taps = math.prod(valid_taps(n, k, p, s, d) for (n, p), k, s, d in dims)
        total += 2 * args[0].shape[0] * conv.out_channels * (conv.in_channels // conv.groups) * taps

    convs = [m for m in module.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    hooks = [m.register_forward_hook(count, with_kwargs=True) for m in convs]
    try:
        with torch.no_grad():
            sample = module.decode(z, *inputs).sample
    finally:
        for h in hooks:
            h.remove()
    return sample, total


def meta_twin(upstream: Any) -> torch.nn.Module:
    """The same VAE built on torch's ``meta`` device: its architecture, no weights.

    The decode switches that change which convolutions run (tiling, slicing,
    the frame batch sizes: plain attributes of the module) are copied over.
    """
    with torch.device("meta"):
        twin = type(upstream).from_config(upstream.config).eval()
    for name, value in vars(upstream).items():
        if not name.startswith("_") and name != "training" and isinstance(value, (bool, int, float)):
            setattr(twin, name, value)
    return twin


def analytic_conv_flops(upstream: Any, shape: tuple[int, ...], twin: torch.nn.Module | None = None) -> int:
    """Convolution FLOPs of upstream's decode of latents of ``shape``, on the meta device.

    Args:
        upstream: the upstream VAE (only its class, config and switches are used).
        shape: latent ``(B, C, T, H, W)``.
        twin: a `meta_twin` of ``upstream`` to reuse (built when not given).
    """
    twin = meta_twin(upstream) if twin is None else twin
    z = torch.empty(shape, device="meta")
    _, total = count_conv_flops(twin, z, *decode_args(twin, z))
    return total


def conv_io_elements(upstream: Any, shape: tuple[int, ...]) -> int:
    """Elements every convolution of upstream's decode reads (its input) and writes (its output), summed.

    Times the dtype's size, a lower bound on the decode's memory traffic:
    each convolution reads its input and writes its output at least once.
    """
    total = 0

    def count(conv, inputs, output):
        nonlocal total
        total += inputs[0].numel() + output.numel()

    twin = meta_twin(upstream)
    hooks = [m.register_forward_hook(count) for m in twin.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    try:
        with torch.no_grad():
            z = torch.empty(shape, device="meta")
            twin.decode(z, *decode_args(twin, z))
    finally:
        for h in hooks:
            h.remove()
    return total
