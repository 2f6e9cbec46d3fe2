"""LTX-2's reflection-padded convolutions padded by `kernels.reflect_pad` (``zero_pad_reflection``).

The released decoder pads height and width by reflection; torch pads the input first (the
shared `FusedBiasConv` does as torch does), and ``jnp.pad``'s reflection is a concatenation
per axis, each a copy of the whole input on a GPU. A zero pad with the borders copied in is
the same input, written once.
"""

from __future__ import annotations

import torch

from cogvideox_torchax.patches.base import Patch
from cogvideox_torchax.patches.conv import FusedBiasConv


def apply_zero_pad_reflection(vae: torch.nn.Module) -> int:
    """Makes every reflection-padded `FusedBiasConv` pad by `kernels.reflect_pad.reflect_pad`.

    Returns:
        How many modules changed in this call (0 on a second call, and for a model with no
        reflection-padded convolution).
    """
    count = 0
    for module in vae.modules():
        if isinstance(module, FusedBiasConv) and module.padding_mode == "reflect" and not module.reflect_by_zero_pad:
            module.reflect_by_zero_pad = True
            count += 1
    return count


PATCHES = (
    Patch(
        "zero_pad_reflection", "ops",
        "Reflection-padded convolutions pad their input as a zero pad with the borders copied in "
        "(`kernels.reflect_pad`), which the compiler fuses into the input's producer, instead of one "
        "concatenation per padded axis, each a copy of the input. CUDA only.",
        lambda m, plan, mesh: apply_zero_pad_reflection(m),
        platforms=("cuda",),
        platforms_why="measured on CUDA only (compiled for an H200)",
        requires=("conv_bias",),
        families=("ltx2",),
    ),
)
