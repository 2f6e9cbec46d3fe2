"""HunyuanVideo 1.5's VAE (`AutoencoderKLHunyuanVideo15`), beside 1.0's: its own record.

Upstream decodes the whole video in one call of its decoder (no frame
windows; spatial tiles only when enabled), its middle block attending over
every latent token with the same frame-causal mask as 1.0's (computed here
without it: `patches.attention`). Its norms are RMS norms and its samplers
fold space and time into channels (depth to space). Pipelines hold latents
``(B, C, T, H, W)`` multiplied by ``scaling_factor``, as 1.0's do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from cogvideox_torchax.families import tiling
from cogvideox_torchax.families.hunyuan import HunyuanVideo
from cogvideox_torchax.families.hunyuan import hunyuan15_config_check as config_check
from cogvideox_torchax.families.hunyuan.presets import HUNYUAN15_PRESETS


def _ceil(n: int, k: int) -> int:
    return -(-n // k)


class HunyuanVideo15(HunyuanVideo):
    """`AutoencoderKLHunyuanVideo15` (HunyuanVideo 1.5)."""

    name = "hunyuan15"
    title = "HunyuanVideo 1.5"
    class_name = "AutoencoderKLHunyuanVideo15"
    presets = HUNYUAN15_PRESETS
    default_model = "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v"
    # The frame rate diffusers' HunyuanVideo 1.5 image-to-video example exports at (its text-to-video one: 15).
    fps = 24.0
    # Its default decode is already the whole video in one call: nothing to turn off.
    untiled_settings = MappingProxyType({})

    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        config_check.check_config(config, source)

    def spatial_scale(self, config: Any) -> int:
        return config_check.spatial_scale(config)

    def frames_of(self, config: Any, latent_frames: int) -> int:
        return 1 + config_check.temporal_scale(config) * (latent_frames - 1)

    def frame_step(self, config: Any) -> int:
        return config_check.temporal_scale(config)

    def frames_read(self, config: Any, frames: int) -> int:
        # The encoder's time folds take the first frame alone, then whole groups: upstream's reshape fails on others.
        return self.round_trip_frames(config, frames)

    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        return module._decode(z), None

    def tiling_keywords(self, module: Any) -> dict[str, Any]:
        return {
            "tile_sample_min_height": module.tile_sample_min_height,
            "tile_sample_min_width": module.tile_sample_min_width,
            "tile_latent_min_height": module.tile_latent_min_height,
            "tile_latent_min_width": module.tile_latent_min_width,
            "tile_overlap_factor": module.tile_overlap_factor,
        }

    def tiles(self, module: Any, latent_hw: tuple[int, int]) -> bool:
        height, width = latent_hw
        return bool(module.use_tiling) and (width > module.tile_latent_min_width
                                            or height > module.tile_latent_min_height)

    def tiled_candidates(self, module: Any, latent_hw: tuple[int, int],
                         counts: Sequence[int] = tiling.COUNTS) -> list[tuple[str, dict[str, Any]]]:
        # Upstream's tiles overlap by a quarter and its tiled decode does not crop: tiles of a multiple of 4
        # latents keep exactly their stride, so the pieces add up to the whole frame.
        ratio = module.spatial_compression_ratio
        found, seen = [], set()
        for k in counts:
            tile = tuple(max(4, 4 * -(-_ceil(n, k) // 4)) for n in latent_hw)
            if tile in seen or (tile[0] >= latent_hw[0] and tile[1] >= latent_hw[1]):
                continue
            seen.add(tile)
            found.append((f"tiles of {tile[0]}x{tile[1]} latents", {
                "tile_latent_min_height": tile[0], "tile_latent_min_width": tile[1],
                "tile_sample_min_height": tile[0] * ratio, "tile_sample_min_width": tile[1] * ratio,
                "tile_overlap_factor": 0.25,
            }))
        return found

    def sharded_outputs(self) -> tuple[type, ...]:
        from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
            HunyuanVideo15CausalConv3d,
            HunyuanVideo15RMS_norm,
            HunyuanVideo15Upsample,
        )

        return (HunyuanVideo15CausalConv3d, HunyuanVideo15RMS_norm, HunyuanVideo15Upsample)


HUNYUAN15 = HunyuanVideo15()
