"""`nn.GroupNorm` by the project's kernel (`kernels.group_norm`) under torchax; its statistics apart from their use.

torchax lowers ``native_group_norm`` with its statistics in the input's
dtype (bf16 means and variances); the kernel's are fp32. The families whose
modules hold a `torch.nn.GroupNorm` take it (CogVideoX's, HunyuanVideo 1.0's).
"""

from __future__ import annotations

import functools

import torch

from cogvideox_torchax.kernels.group_norm import group_norm, group_norm_apply, group_norm_statistics
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes


class JaxGroupNorm(torch.nn.GroupNorm):
    """`nn.GroupNorm` computed by `kernels.group_norm.group_norm` under torchax."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not is_torchax(input):
            return super().forward(input)
        fn = functools.partial(group_norm, num_groups=self.num_groups, eps=self.eps)
        return interop.torch_view(fn)(input, self.weight, self.bias)

    def statistics(self, input: torch.Tensor, *, by_frame: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-channel fp32 mean and inverse deviation of ``input`` (torchax only), for `apply`.

        ``by_frame``: see `kernels.group_norm.group_norm_statistics`.
        """
        fn = functools.partial(group_norm_statistics, num_groups=self.num_groups, eps=self.eps, by_frame=by_frame)
        return interop.torch_view(fn)(input)

    def apply(self, part: torch.Tensor, statistics: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``forward`` of the tensor ``statistics`` came from, on ``part`` of it (same values there)."""
        return interop.torch_view(group_norm_apply)(part, *statistics, self.weight, self.bias)


def apply_group_norm(vae: torch.nn.Module) -> int:
    """Makes every `nn.GroupNorm` in ``vae`` a `JaxGroupNorm`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {torch.nn.GroupNorm: JaxGroupNorm})


PATCHES = (
    Patch(
        "group_norm", "ops",
        "Replace `nn.GroupNorm` with `kernels.group_norm` (fp32 statistics, no full-size fp32 copy). "
        "False keeps torchax's lowering of the upstream op, for comparison.",
        lambda m, plan, mesh: apply_group_norm(m),
        # The families whose modules hold one: the others' plans do not list it.
        families=("cogvideox", "hunyuan"),
    ),
)
