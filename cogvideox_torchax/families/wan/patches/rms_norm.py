"""`WanRMS_norm` by `kernels.rms_norm` under torchax: fp32 throughout, one rounding."""

from __future__ import annotations

import functools

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

from cogvideox_torchax.kernels.rms_norm import rms_norm
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes


class JaxRMSNorm(WanRMS_norm):
    """`WanRMS_norm` computed by `kernels.rms_norm.rms_norm` under torchax (upstream's forward otherwise)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not is_torchax(x):
            return super().forward(x)
        fn = functools.partial(rms_norm, axis=1 if self.channel_first else -1)
        return interop.torch_view(fn)(x, self.gamma, self.bias)


def apply_rms_norm(vae: torch.nn.Module) -> int:
    """Makes every `WanRMS_norm` in ``vae`` a `JaxRMSNorm`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {WanRMS_norm: JaxRMSNorm})


PATCHES = (
    Patch(
        "wan_rms_norm", "ops",
        "Replace `WanRMS_norm` with `kernels.rms_norm` (fp32 throughout, one rounding in bf16 and fp16 where "
        "upstream rounds three times); False keeps torchax's lowering of upstream's forward.",
        lambda m, plan, mesh: apply_rms_norm(m),
        families=("wan",),
    ),
)
