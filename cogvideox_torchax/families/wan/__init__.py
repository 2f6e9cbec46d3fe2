"""Wan's VAE (`AutoencoderKLWan`: Wan 2.1, Wan 2.2 A14B, and with ``z_dim=48`` and 2x2 patches Wan 2.2 TI2V-5B).

Upstream decodes one latent frame at a time (1 video frame for the first,
4 for each later one), threading a list of feature caches
(`cogvideox_torchax.families.wan.chunks`); it encodes the first frame,
then 4 at a time. Pipelines hold latents ``(B, C, T, H, W)`` normalised per
channel, ``(z - latents_mean) / latents_std``, and denormalise before
decoding. Its patches are `cogvideox_torchax.families.wan.patches`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cogvideox_torchax.families import tiling
from cogvideox_torchax.families.base import Family
from cogvideox_torchax.families.wan import config_check
from cogvideox_torchax.families.wan.presets import PRESETS


def _per_channel(values: Any, like: np.ndarray) -> np.ndarray:
    # (C,) -> (1, C, 1, 1, 1), float32, as the pipeline's view(1, z_dim, 1, 1, 1).
    return np.asarray(values, dtype=np.float32).reshape(1, -1, *([1] * (like.ndim - 2)))


class Wan(Family):
    """`AutoencoderKLWan` (Wan 2.1 and 2.2)."""

    name = "wan"
    title = "Wan"
    class_name = "AutoencoderKLWan"
    presets = PRESETS
    default_model = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    patch_package = "cogvideox_torchax.families.wan.patches"
    # Wan 2.1's videos are 16 fps (its pipelines' and model cards' export_to_video(fps=16)).
    fps = 16.0
    pipeline_layout = "BCTHW"
    stream_needs = "wan_frame_scan"
    metadata_keys = ("latents_mean", "latents_std")
    normalization = "normalised per channel by config.latents_mean and config.latents_std"

    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        config_check.check_config(config, source)

    def latent_channels(self, config: Any) -> int:
        return int(config["z_dim"])

    def video_channels(self, config: Any) -> int:
        return int(config["in_channels"]) // (config["patch_size"] or 1) ** 2

    def spatial_scale(self, config: Any) -> int:
        return config_check.spatial_scale(config)

    def frames_of(self, config: Any, latent_frames: int) -> int:
        return 1 + config_check.temporal_scale(config) * (latent_frames - 1)

    def frame_step(self, config: Any) -> int:
        return config_check.TEMPORAL_SCALE

    def frames_read(self, config: Any, frames: int) -> int:
        # The first frame, then whole chunks of 4: upstream's encode drops the rest.
        return self.round_trip_frames(config, frames)

    def pipeline_word(self) -> str:
        return "denormalized"

    def frame_rule(self, config: Any) -> str:
        return "4k+1"

    def stream_batches(self, module: Any, latent_frames: int) -> list[tuple[int, int]]:
        return [(i, i + 1) for i in range(latent_frames)]

    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        from cogvideox_torchax.families.wan import chunks

        out, cache = chunks.decode_chunk(module, z, None if first else cache)
        return chunks.finish(module, out), cache

    def tiling_keywords(self, module: Any) -> dict[str, Any]:
        return {
            "tile_sample_min_height": module.tile_sample_min_height,
            "tile_sample_min_width": module.tile_sample_min_width,
            "tile_sample_stride_height": module.tile_sample_stride_height,
            "tile_sample_stride_width": module.tile_sample_stride_width,
        }

    def tiles(self, module: Any, latent_hw: tuple[int, int]) -> bool:
        height, width = latent_hw
        ratio = module.spatial_compression_ratio
        return bool(module.use_tiling) and (width > module.tile_sample_min_width // ratio
                                            or height > module.tile_sample_min_height // ratio)

    def tiled_candidates(self, module: Any, latent_hw: tuple[int, int],
                         counts: Sequence[int] = tiling.COUNTS) -> list[tuple[str, dict[str, Any]]]:
        # Upstream's tiles step by 3/4 of their size (256 pixels, stride 192).
        return tiling.strided_candidates(latent_hw, module.spatial_compression_ratio, fraction=3 / 4, smallest=4,
                                         counts=counts)

    def from_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        # As WanPipeline before vae.decode: latents / (1 / std) + mean.
        std = _per_channel(config["latents_std"], z)
        return z / (np.float32(1.0) / std) + _per_channel(config["latents_mean"], z)

    def to_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        # As WanImageToVideoPipeline after vae.encode: (latents - mean) * (1 / std).
        std = _per_channel(config["latents_std"], z)
        return (z - _per_channel(config["latents_mean"], z)) * (np.float32(1.0) / std)

    def unscaled_phrase(self, config: Any) -> str:
        return "after denormalizing by config.latents_mean and config.latents_std"

    def normalization_metadata(self, config: Any) -> dict[str, str]:
        return {"latents_mean": repr([float(v) for v in config["latents_mean"]]),
                "latents_std": repr([float(v) for v in config["latents_std"]])}

    def sharded_outputs(self) -> tuple[type, ...]:
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanResample, WanRMS_norm

        return (WanCausalConv3d, WanRMS_norm, WanResample)


WAN = Wan()
