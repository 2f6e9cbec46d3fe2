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


def valid_taps(n: int, k: int, p: int, s: int, d: int) -> int:
    """Kernel taps that land inside an input of length ``n``, summed over all outputs of one dim."""
    out = (n + 2 * p - d * (k - 1) - 1) // s + 1
    return sum(1 for o in range(out) for t in range(k) if 0 <= o * s - p + t * d < n)


def count_conv_flops(module: torch.nn.Module, z: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Runs ``module.decode(z)`` and counts the FLOPs of every convolution it calls.

    2 FLOPs per multiply-add whose input is real data, not zero padding (the
    count XLA's cost analysis makes too; causal time padding is real frames
    and counts). Bias adds are not counted. This is the work the decode must
    do; XLA's count of ours also holds the elementwise ops and any waste.

    Returns:
        the decoded sample (on ``z``'s device) and the FLOP count.
    """
    total = 0

    def count(conv, inputs, output):
        nonlocal total
        x = inputs[0]
        dims = zip(x.shape[2:], conv.kernel_size, conv.padding, conv.stride, conv.dilation, strict=True)
        taps = math.prod(valid_taps(n, k, p, s, d) for n, k, p, s, d in dims)
        total += 2 * x.shape[0] * conv.out_channels * (conv.in_channels // conv.groups) * taps

    convs = [m for m in module.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    hooks = [m.register_forward_hook(count) for m in convs]
    try:
        with torch.no_grad():
            sample = module.decode(z).sample
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
    _, total = count_conv_flops(twin, torch.empty(shape, device="meta"))
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
            twin.decode(torch.empty(shape, device="meta"))
    finally:
        for h in hooks:
            h.remove()
    return total
