"""HunyuanVideo's VAE (`AutoencoderKLHunyuanVideo`: HunyuanVideo, FramePack, SkyReels V1, Kandinsky 5), 1.5's beside it.

Upstream decodes a short video (at most ``tile_sample_min_num_frames // 4``
latent frames, 4 by default) in one call of its decoder, a longer one in
overlapping frame windows blended at their seams (``use_framewise_decoding``,
on by default), each window through the whole causal decoder with no cache
between them. Both middle blocks attend over every token of what they see
with a frame-causal mask (`patches.attention` computes it without the
mask). Pipelines hold latents ``(B, C, T, H, W)`` multiplied by
``scaling_factor``. Its patches are `cogvideox_torchax.families.hunyuan.patches`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from cogvideox_torchax.families import tiling
from cogvideox_torchax.families.base import Family
from cogvideox_torchax.families.hunyuan import config_check
from cogvideox_torchax.families.hunyuan.presets import PRESETS


class HunyuanVideo(Family):
    """`AutoencoderKLHunyuanVideo` (HunyuanVideo 1.0 and the pipelines built on its VAE)."""

    name = "hunyuan"
    title = "HunyuanVideo"
    class_name = "AutoencoderKLHunyuanVideo"
    presets = PRESETS
    default_model = "hunyuanvideo-community/HunyuanVideo"
    patch_package = "cogvideox_torchax.families.hunyuan.patches"
    # The frame rate diffusers' HunyuanVideo pipeline examples export at.
    fps = 15.0
    pipeline_layout = "BCTHW"
    # One batch, the whole video, as upstream decodes it: its windows carry nothing from one to the next.
    stream_needs = None
    metadata_keys = ("scaling_factor",)
    normalization = "multiplied by config.scaling_factor"
    # Upstream's switches of its frame windows: off, the whole video in one decoder (encoder) call.
    untiled_settings = MappingProxyType({"use_framewise_decoding": False, "use_framewise_encoding": False})

    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        config_check.check_config(config, source)

    def latent_channels(self, config: Any) -> int:
        return int(config_check.merged(config)["latent_channels"])

    def video_channels(self, config: Any) -> int:
        return int(config_check.merged(config)["in_channels"])

    def spatial_scale(self, config: Any) -> int:
        return config_check.spatial_scale(config)

    def frames_of(self, config: Any, latent_frames: int) -> int:
        # Each time-doubling upsampler keeps the first frame and doubles the rest; past one window, upstream's
        # default frame windows keep and crop by the config's ratio (the same count where the ratio is the
        # decoder's own).
        return config_check.windowed_frames(config, latent_frames)

    def frame_step(self, config: Any) -> int:
        return config_check.temporal_scale(config)

    def frames_read(self, config: Any, frames: int) -> int:
        # Every frame reaches the causal encoder (its strided convolutions round up).
        return frames

    def frame_rule(self, config: Any) -> str:
        return f"{self.frame_step(config)}k+1"

    def stream_batches(self, module: Any, latent_frames: int) -> list[tuple[int, int]]:
        return [(0, latent_frames)]

    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        # The whole video as upstream's _decode (its windows where it takes them).
        return module._decode(z, return_dict=False)[0], None

    def tiling_keywords(self, module: Any) -> dict[str, Any]:
        return {
            "tile_sample_min_height": module.tile_sample_min_height,
            "tile_sample_min_width": module.tile_sample_min_width,
            "tile_sample_min_num_frames": module.tile_sample_min_num_frames,
            "tile_sample_stride_height": module.tile_sample_stride_height,
            "tile_sample_stride_width": module.tile_sample_stride_width,
            "tile_sample_stride_num_frames": module.tile_sample_stride_num_frames,
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
        # As HunyuanVideoPipeline before vae.decode: latents / scaling_factor.
        return z / np.float32(config["scaling_factor"])

    def to_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        # As HunyuanVideoImageToVideoPipeline after vae.encode: latents * scaling_factor.
        return z * np.float32(config["scaling_factor"])

    def unscaled_phrase(self, config: Any) -> str:
        return f"after dividing by the scaling factor {float(config['scaling_factor']):g}"

    def normalization_metadata(self, config: Any) -> dict[str, str]:
        return {"scaling_factor": repr(float(config["scaling_factor"]))}

    def sharded_outputs(self) -> tuple[type, ...]:
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (
            HunyuanVideoCausalConv3d,
            HunyuanVideoUpsampleCausal3D,
        )

        return (HunyuanVideoCausalConv3d, torch.nn.GroupNorm, HunyuanVideoUpsampleCausal3D)


HUNYUAN = HunyuanVideo()
