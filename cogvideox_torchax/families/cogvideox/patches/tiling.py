"""CogVideoX's tiled decode with upstream's tiles and blending, equal-shape tiles batched (``tile_batching``).

Upstream's ``tiled_decode`` decodes tiles of ``tile_latent_min_height x
tile_latent_min_width`` latents, stepping by the tile size times ``1 -
overlap factor``, and blends over ``tile_sample_min * overlap factor``
pixels. `BatchedTilesMixin` reads those attributes and decodes the tiles by
shape group (`cogvideox_torchax.patches.tiling`); each group's tiles run
through upstream's ``_decode`` (the frame scan's, where applied).
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.patches.base import Patch, is_torchax
from cogvideox_torchax.patches.tiling import add_batching, decode_tile_group, decode_tiles


class BatchedTilesMixin:
    """Overrides ``tiled_decode``: upstream's tiles, decoded by shape group under torchax.

    ``tiles_per_step`` (set by `apply_tile_batching`) is how many tiles one
    scan step decodes together.
    """

    tiles_per_step: int = 1

    def tiled_decode(self, z: torch.Tensor, return_dict: bool = True):
        if not is_torchax(z):
            return super().tiled_decode(z, return_dict=return_dict)
        tile_h, tile_w = self.tile_latent_min_height, self.tile_latent_min_width
        step_h = int(tile_h * (1 - self.tile_overlap_factor_height))
        step_w = int(tile_w * (1 - self.tile_overlap_factor_width))
        extent_h = int(self.tile_sample_min_height * self.tile_overlap_factor_height)
        extent_w = int(self.tile_sample_min_width * self.tile_overlap_factor_width)
        keep_h = self.tile_sample_min_height - extent_h
        keep_w = self.tile_sample_min_width - extent_w
        dec = decode_tiles(z, (tile_h, tile_w), (step_h, step_w), (extent_h, extent_w), (keep_h, keep_w),
                           self._decode_tile_group)
        if not return_dict:
            return (dec,)
        return DecoderOutput(sample=dec)

    def _decode_tile_group(self, stacked: torch.Tensor, count: int) -> torch.Tensor:
        """Decodes ``count`` same-shape tiles stacked on the batch, ``tiles_per_step`` per scan step."""

        def decode(tiles: torch.Tensor) -> torch.Tensor:
            # Tiles are at most one tile in size: _decode never re-enters tiling.
            (video,) = self._decode(tiles, return_dict=False)
            return video

        return decode_tile_group(decode, stacked, count, self.tiles_per_step)


def apply_tile_batching(vae: AutoencoderKLCogVideoX, tiles_per_step: int = 1) -> int:
    """Makes ``vae``'s tiled decode group equal-shape tiles and scan over them.

    Tiling itself stays upstream's switch: ``vae.enable_tiling(...)``.

    Composes with `frame_scan.apply_frame_scan` in either order.

    Args:
        vae: an upstream VAE (possibly already frame-scanned).
        tiles_per_step: tiles decoded together in one scan step; memory grows
            with it. The mesh's ``dp`` size spreads one tile per replica.

    Returns:
        1 if ``vae``'s class changed in this call, else 0 (``tiles_per_step``
        is updated either way).
    """
    if not issubclass(type(vae), AutoencoderKLCogVideoX):  # not a TorchaxVAE, which passes isinstance
        raise TypeError(f"apply_tile_batching expects an AutoencoderKLCogVideoX, got {type(vae).__name__}")
    return add_batching(vae, BatchedTilesMixin, "tiles_per_step", tiles_per_step)


PATCHES = (
    Patch(
        "tile_batching", "loops",
        "When tiling is enabled (`TorchaxVAE.enable_tiling`), decode equal-shape tiles together, one per ``dp`` "
        "replica per scan step; False traces upstream's loop, one decoder per tile.",
        lambda m, plan, mesh: apply_tile_batching(m, tiles_per_step=plan.placement.dp),
        families=("cogvideox",),
    ),
)
