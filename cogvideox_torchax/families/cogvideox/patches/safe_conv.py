"""`CogVideoXSafeConv3d` as the one convolution it computes, without upstream's memory-size chunking."""

from __future__ import annotations

import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSafeConv3d

from cogvideox_torchax.patches.base import Patch, mixed, swap_classes
from cogvideox_torchax.patches.conv import FusedBiasConv


class ChunkFreeSafeConv3d(CogVideoXSafeConv3d):
    """`CogVideoXSafeConv3d` as the single convolution it computes.

    Upstream splits inputs over 2 GB (counted as if 2-byte elements) into time
    chunks with overlapping halos, a cuDNN workaround. Under XLA that only
    fragments one convolution into several and concatenates them; the result
    is the same, so we run the plain `nn.Conv3d` forward.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.nn.Conv3d.forward(self, input)


def apply_safe_conv(vae: torch.nn.Module) -> int:
    """Makes every `CogVideoXSafeConv3d` in ``vae`` a `ChunkFreeSafeConv3d`, keeping the ``conv_bias`` kernel.

    Composes with `cogvideox_torchax.patches.conv.apply_conv_bias` in
    either order: both give the class ``mixed(FusedBiasConv, ChunkFreeSafeConv3d)``.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {
        CogVideoXSafeConv3d: ChunkFreeSafeConv3d,
        mixed(FusedBiasConv, CogVideoXSafeConv3d): mixed(FusedBiasConv, ChunkFreeSafeConv3d),
    })


def _chunk_free_why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.profile.gpu and "conv_bias" not in applied:
        return "on a GPU, upstream's chunking is the only guard against 2^31-element convolutions without conv_bias"
    return None


PATCHES = (
    Patch(
        "chunk_free_conv", "ops",
        "Run `CogVideoXSafeConv3d` as one convolution instead of upstream's memory-size chunking. On a GPU only "
        "together with ``conv_bias``, whose kernel splits what cuDNN cannot take.",
        lambda m, plan, mesh: apply_safe_conv(m),
        families=("cogvideox",),
        # Its condition reads whether conv_bias was applied.
        after=("conv_bias",),
        why_not=_chunk_free_why_not,
    ),
)
