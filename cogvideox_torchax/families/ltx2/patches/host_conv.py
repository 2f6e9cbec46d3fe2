"""LTX-2's and LTX-Video's convolutions in a one-device fp32 CPU program, run by the host's torch (``host_conv``).

Convolutions are nearly all of a CPU decode's time, and on x86 XLA:CPU's take
up to 6x oneDNN's, which eager torch runs: those of fewer than 1024 input
channels (`runs_on_host`). Run by torch on the program's own buffers
(`kernels.host_conv`), they take oneDNN's time; the others stay XLA's, as
fast or faster there. Measured per convolution and over the decode of LTX-2,
LTX-2.3 and LTX-Video 0.9.5 (docs/results/ltx2-cpu-host-conv-2026-12-08.md);
CogVideoX's and Wan's CPU decodes gained nothing, so they do not take it. The
weights torch reads stay in upstream's layout (``keeps_upstream_weight_layout``).
JAX keeps no program holding a host callback in its persistent cache: such a
program compiles in each process (1.7 s for LTX-2's decode here).
"""

from __future__ import annotations

import dataclasses

import torch

from cogvideox_torchax.patches.base import Patch
from cogvideox_torchax.patches.conv import FusedBiasConv

# Below this many input channels oneDNN was as fast or faster at both shapes
# measured (LTX-2's decoder at 9 x 128x192 and 17 x 256x384: 0.95 to 6x). At 1024 it was
# only where the convolution pads its input itself (LTX-2.3's and LTX-Video's
# zero padding): given an input padded before it (LTX-2's reflection), oneDNN
# took 73 ms for 1024 -> 1024 at 2 x 4x6 against 22 ms padding zeros itself, and
# XLA:CPU 46.
HOST_BELOW_CHANNELS = 1024


def runs_on_host(module: torch.nn.Module) -> bool:
    """Whether oneDNN runs this convolution faster than XLA:CPU, as measured (`HOST_BELOW_CHANNELS`)."""
    pads_itself = module.padding_mode == "zeros" and not isinstance(module.padding, str) and any(module.padding)
    return module.in_channels < HOST_BELOW_CHANNELS or pads_itself


def apply_host_conv(vae: torch.nn.Module) -> int:
    """Makes each `FusedBiasConv` of ``vae`` that oneDNN runs the faster (`runs_on_host`) run by the host's torch.

    Sets `kernels.conv.ConvPolicy.host`, keeping the module's policy
    otherwise (its split size), and keeps its weight in upstream's layout
    for the program (`vae.weight_layout`).

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = 0
    for module in vae.modules():
        if isinstance(module, FusedBiasConv) and runs_on_host(module) and not module.conv_policy.host:
            module.conv_policy = dataclasses.replace(module.conv_policy, host=True)
            module.keeps_upstream_weight_layout = True
            count += 1
    return count


def _why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.dp * placement.tp > 1:
        return "one device only: XLA cannot partition a host call, so each device would run every convolution whole"
    if placement.dtype != "float32":
        return "measured in fp32 only"
    return None


PATCHES = (
    Patch(
        "host_conv", "ops",
        "Convolutions oneDNN runs faster than XLA:CPU (fewer than 1024 input channels, or padding zeros "
        "themselves) run by the host's torch on the program's own buffers (`kernels.host_conv`). "
        "One-device fp32 CPU programs; such a program is not kept in JAX's persistent cache.",
        lambda m, plan, mesh: apply_host_conv(m),
        requires=("conv_bias",),
        why_not=_why_not,
        families=("ltx2", "ltx-video"),
        platforms=("cpu",),
        platforms_why="a host call: for XLA:CPU's programs only",
    ),
)
