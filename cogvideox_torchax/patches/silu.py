"""`nn.SiLU` by the project's kernel (`kernels.silu`) under torchax: every family's activation."""

from __future__ import annotations

import torch

from cogvideox_torchax.kernels.silu import silu
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes


class JaxSiLU(torch.nn.SiLU):
    """`nn.SiLU` computed by `kernels.silu.silu` (one rounding) under torchax."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not is_torchax(input):
            return super().forward(input)
        return interop.torch_view(silu)(input)


def apply_silu(vae: torch.nn.Module) -> int:
    """Makes every `nn.SiLU` in ``vae`` a `JaxSiLU`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {torch.nn.SiLU: JaxSiLU})


PATCHES = (
    Patch(
        "silu", "ops",
        "Replace `nn.SiLU` with `kernels.silu` (rounds once in bf16 and fp16, as torch does; torchax's lowering "
        "rounds twice).",
        lambda m, plan, mesh: apply_silu(m),
    ),
)
