"""Wan's tiled decode with upstream's tiles and blending, equal-shape tiles batched, each tile's frames one scan.

Upstream's ``tiled_decode`` cuts the latent frame into overlapping tiles
(``tile_sample_min_*`` pixels, stepping by ``tile_sample_stride_*``), runs
each tile through its own per-frame loop, blends every tile into its upper
and left neighbours over the overlap, crops, then unpatchifies and clamps
the whole. Traced into one jit that is one decoder per tile and per latent
frame. Here the grid, blending and crop are upstream's (CogVideoX's shared
`cogvideox_torchax.patches.tiling.decode_tiles`), tiles of one shape are
stacked on the batch and decoded ``tiles_per_step`` at a time as scan
steps, and each tile's frames run through the frame scan
(``decode_frames``: `frame_scan.WanFrameScanMixin`'s, or the video carry's
where planned): the program holds one
decoder per tile shape, whatever the tile count and the length.
"""

from __future__ import annotations

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.families.wan import chunks
from cogvideox_torchax.patches.base import Patch, is_torchax
from cogvideox_torchax.patches.tiling import add_batching, decode_tile_group, decode_tiles


class WanBatchedTilesMixin:
    """Overrides ``tiled_decode``: upstream's tiles, decoded by shape group under torchax (needs the frame scan)."""

    tiles_per_step: int = 1

    def tiled_decode(self, z: torch.Tensor, return_dict: bool = True):
        if not is_torchax(z):
            return super().tiled_decode(z, return_dict=return_dict)
        _, _, _, height, width = z.shape
        ratio, patch = self.spatial_compression_ratio, self.config.patch_size or 1
        tile = (self.tile_sample_min_height // ratio, self.tile_sample_min_width // ratio)
        step = (self.tile_sample_stride_height // ratio, self.tile_sample_stride_width // ratio)
        # Pixels of the decoder's (patchified) output, as upstream counts them.
        keep = (self.tile_sample_stride_height // patch, self.tile_sample_stride_width // patch)
        extent = (self.tile_sample_min_height // patch - keep[0], self.tile_sample_min_width // patch - keep[1])
        dec = decode_tiles(z, tile, step, extent, keep, self._decode_tile_group)
        dec = chunks.finish(self, dec[:, :, :, : height * ratio // patch, : width * ratio // patch])
        return DecoderOutput(sample=dec) if return_dict else (dec,)

    def _decode_tile_group(self, stacked: torch.Tensor, count: int) -> torch.Tensor:
        """Decodes ``count`` same-shape tiles stacked on the batch, ``tiles_per_step`` per scan step."""
        return decode_tile_group(lambda tiles: self.decode_frames(tiles, finish=False), stacked, count,
                                 self.tiles_per_step)


def apply_tile_batching(vae: AutoencoderKLWan, tiles_per_step: int = 1) -> int:
    """Makes ``vae``'s tiled decode group equal-shape tiles and scan over them and over their frames.

    Tiling itself stays upstream's switch (``vae.enable_tiling(...)``); the
    frame scan (`frame_scan.apply_frame_scan`) must be applied first.

    Returns:
        1 if ``vae``'s class changed in this call, else 0 (``tiles_per_step`` is updated either way).
    """
    if not issubclass(type(vae), AutoencoderKLWan):  # not a TorchaxVAE, which passes isinstance
        raise TypeError(f"apply_tile_batching expects an AutoencoderKLWan, got {type(vae).__name__}")
    if not hasattr(vae, "decode_frames"):
        raise ValueError("Wan's tile batching decodes each tile through the frame scan: apply wan_frame_scan first")
    return add_batching(vae, WanBatchedTilesMixin, "tiles_per_step", tiles_per_step)


PATCHES = (
    Patch(
        "wan_tile_batching", "loops",
        "When tiling is enabled (`TorchaxVAE.enable_tiling`), decode equal-shape tiles together, one per ``dp`` "
        "replica per scan step, each tile's frames as one scan; False traces upstream's loops, one decoder per tile "
        "and latent frame.",
        lambda m, plan, mesh: apply_tile_batching(m, tiles_per_step=plan.placement.dp),
        requires=("wan_frame_scan",),
        families=("wan",),
    ),
)
