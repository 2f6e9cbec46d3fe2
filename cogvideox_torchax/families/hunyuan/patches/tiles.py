"""HunyuanVideo's spatial tiles (1.0 and 1.5) with upstream's grid and blending, equal-shape tiles one scan.

Upstream's ``tiled_decode`` cuts the latent frame into overlapping tiles,
runs each through the whole decoder (1.0 through ``post_quant_conv`` first),
blends every tile into its upper and left neighbours and keeps each tile's
first stride of pixels (1.0 crops the joined frame to the video's size).
Traced into one jit that is one decoder per tile, and the memory planner
compiles one such program per tiling it tries. Here the grid, the blending
and the crop are upstream's (`cogvideox_torchax.patches.tiling.decode_tiles`),
and tiles of one shape (at most four) are stacked on the batch and decoded
as the steps of one scan: one decoder per tile shape, whatever the tile
count. A step decodes about ``tiles_per_step`` (the mesh's ``dp``) videos'
tiles: inside 1.0's frame windows, which stack ``dp`` windows on the batch
already, one tile of each (`_per_step`), the scan nested in the windows' own.
"""

from __future__ import annotations

import torch
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import AutoencoderKLHunyuanVideo
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import AutoencoderKLHunyuanVideo15
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.patches.base import Patch, is_torchax
from cogvideox_torchax.patches.tiling import add_batching, decode_tile_group, decode_tiles


def _per_step(tiles_per_step: int, batch: int) -> int:
    """Tiles per scan step for ``batch`` stacked videos (or windows): about ``tiles_per_step`` of them, at least one."""
    return max(1, tiles_per_step // batch)


class HunyuanBatchedTilesMixin:
    """Overrides 1.0's ``tiled_decode``: upstream's tiles, decoded by shape group under torchax."""

    tiles_per_step: int = 1

    def tiled_decode(self, z: torch.Tensor, return_dict: bool = True):
        if not is_torchax(z):
            return super().tiled_decode(z, return_dict=return_dict)
        ratio = self.spatial_compression_ratio
        tile = (self.tile_sample_min_height // ratio, self.tile_sample_min_width // ratio)
        step = (self.tile_sample_stride_height // ratio, self.tile_sample_stride_width // ratio)
        keep = (self.tile_sample_stride_height, self.tile_sample_stride_width)
        extent = (self.tile_sample_min_height - keep[0], self.tile_sample_min_width - keep[1])

        def decode(tiles: torch.Tensor) -> torch.Tensor:
            return self.decoder(self.post_quant_conv(tiles))

        per_step = _per_step(self.tiles_per_step, z.shape[0])
        dec = decode_tiles(z, tile, step, extent, keep,
                           lambda stacked, count: decode_tile_group(decode, stacked, count, per_step))
        dec = dec[:, :, :, : z.shape[3] * ratio, : z.shape[4] * ratio]
        return DecoderOutput(sample=dec) if return_dict else (dec,)


class Hunyuan15BatchedTilesMixin:
    """Overrides 1.5's ``tiled_decode``: upstream's tiles (its overlap factor), decoded by shape group under torchax."""

    tiles_per_step: int = 1

    def tiled_decode(self, z: torch.Tensor) -> torch.Tensor:
        if not is_torchax(z):
            return super().tiled_decode(z)
        factor = self.tile_overlap_factor
        tile = (self.tile_latent_min_height, self.tile_latent_min_width)
        step = (int(tile[0] * (1 - factor)), int(tile[1] * (1 - factor)))
        extent = (int(self.tile_sample_min_height * factor), int(self.tile_sample_min_width * factor))
        keep = (self.tile_sample_min_height - extent[0], self.tile_sample_min_width - extent[1])
        per_step = _per_step(self.tiles_per_step, z.shape[0])
        return decode_tiles(z, tile, step, extent, keep,
                            lambda stacked, count: decode_tile_group(self.decoder, stacked, count, per_step))


def apply_tile_batching(vae: torch.nn.Module, tiles_per_step: int = 1) -> int:
    """Makes ``vae``'s tiled decode (1.0's or 1.5's) group equal-shape tiles and scan over them.

    Tiling itself stays upstream's switch (``vae.enable_tiling(...)``).

    Returns:
        1 if ``vae``'s class changed in this call, else 0 (``tiles_per_step`` is updated either way).
    """
    # Not a TorchaxVAE, which passes isinstance: the module itself.
    if issubclass(type(vae), AutoencoderKLHunyuanVideo):
        mixin = HunyuanBatchedTilesMixin
    elif issubclass(type(vae), AutoencoderKLHunyuanVideo15):
        mixin = Hunyuan15BatchedTilesMixin
    else:
        raise TypeError(f"HunyuanVideo's tile batching expects its 1.0 or 1.5 VAE, got {type(vae).__name__}")
    return add_batching(vae, mixin, "tiles_per_step", tiles_per_step)


PATCHES = (
    Patch(
        "hunyuan_tile_batching", "loops",
        "When tiling is enabled (`TorchaxVAE.enable_tiling`), decode HunyuanVideo's equal-shape tiles together, one "
        "video's (or window's) tile per ``dp`` replica per scan step: the program holds one decoder per tile shape "
        "whatever the tile count; False traces upstream's loop, one decoder per tile.",
        lambda m, plan, mesh: apply_tile_batching(m, tiles_per_step=plan.placement.dp),
        families=("hunyuan", "hunyuan15"),
    ),
)
