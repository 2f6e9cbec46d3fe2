"""Each `WanRMS_norm` reads its input as stored (bf16), behind an optimization barrier.

The norm's statistics (a sum of squares over channels) and its scaling
both read the input. Compiled for TPU (v6e, `tp=8`, Wan 2.1 at 720p), XLA
fused the producer of a resnet block's output (convolution, bias,
residual add) with the fp32 upcast and the square the norm starts with,
dropping the bf16 rounding between them (excess precision), and wrote
both fp32 results out for the two readers: two fp32 activations of the
last up block where one bf16 would do. Behind the barrier the input is
stored once in bf16 and each reader computes in fp32 from it, rounding
as upstream does. Values: upstream's (a barrier computes nothing).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

from cogvideox_torchax.patches.base import Patch, add_mixin, barrier, is_torchax


class StoredInputNormMixin:
    """Puts the norm's input behind an optimization barrier under torchax (upstream's forward otherwise)."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if is_torchax(x):
            x = barrier(x)
        return super().forward(x, *args, **kwargs)


def apply_norm_input(vae: torch.nn.Module) -> int:
    """Gives every `WanRMS_norm` of ``vae`` (patched or not) the `StoredInputNormMixin`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return sum(add_mixin(m, StoredInputNormMixin) for m in vae.modules() if isinstance(m, WanRMS_norm))


PATCHES = (
    Patch(
        "wan_norm_input", "layers",
        "Each `WanRMS_norm` reads its input as stored in the activation dtype (an optimization barrier): the TPU "
        "compiler otherwise fuses the norm's fp32 upcast and square into the producer and stores both in fp32.",
        lambda m, plan, mesh: apply_norm_input(m),
        families=("wan",),
        platforms=("tpu",),
        platforms_why="measured on TPU only (compiled for v6e)",
        after=("wan_rms_norm",),
    ),
)
