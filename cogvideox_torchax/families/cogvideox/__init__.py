"""CogVideoX's VAE (`AutoencoderKLCogVideoX`: CogVideoX 1.0 and 1.5).

Upstream decodes latent frames in batches of two (the odd remainder joins
the first), threading a dict of causal-conv caches; one latent frame decodes
to 1 video frame, each later pair to 8. Pipelines hold latents
``(B, T, C, H, W)`` multiplied by ``scaling_factor``. Its patches are
`cogvideox_torchax.families.cogvideox.patches`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cogvideox_torchax.families.base import Family
from cogvideox_torchax.families.cogvideox import config_check, tiling
from cogvideox_torchax.families.cogvideox.presets import PRESETS

# Upstream's num_latent_frames_batch_size: the latent frames its decode loop takes at a time.
_BATCH = 2


class CogVideoX(Family):
    """`AutoencoderKLCogVideoX` (CogVideoX 1.0 and 1.5)."""

    name = "cogvideox"
    title = "CogVideoX"
    class_name = "AutoencoderKLCogVideoX"
    presets = PRESETS
    default_model = "THUDM/CogVideoX-2b"
    patch_package = "cogvideox_torchax.families.cogvideox.patches"
    fps = 8.0
    pipeline_layout = "BTCHW"
    stream_needs = "trim_conv_cache"
    metadata_keys = ("scaling_factor",)
    normalization = "multiplied by config.scaling_factor"

    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        config_check.check_config(config, source)

    def latent_channels(self, config: Any) -> int:
        return int(config["latent_channels"])

    def video_channels(self, config: Any) -> int:
        return int(config["in_channels"])

    def spatial_scale(self, config: Any) -> int:
        return 2 ** (len(config["block_out_channels"]) - 1)

    def frames_of(self, config: Any, latent_frames: int) -> int:
        # Upstream decodes latent frames two at a time (an odd remainder joins
        # the first batch); each time-doubling resampler turns a batch of t
        # frames into 2 t (t even), 1 + 2 (t - 1) (t odd, the first kept) or
        # 1 (t = 1). At the released two levels: 1 -> 1, even T -> 4T, odd -> 4T-3.
        levels = config_check.time_levels(config)
        first = latent_frames if latent_frames < _BATCH else _BATCH + latent_frames % _BATCH
        batches = [first] + [_BATCH] * ((latent_frames - first) // _BATCH)
        return sum(1 if t == 1 else (t - 1) * 2**levels + 1 if t % 2 else t * 2**levels for t in batches)

    def frame_step(self, config: Any) -> int:
        # A batch of two latent frames is 2 x 2^levels video frames after a
        # first of one more: those counts round-trip (8k + 1 at two levels).
        levels = config_check.time_levels(config)
        return _BATCH * 2**levels if levels else 1

    def frames_read(self, config: Any, frames: int) -> int:
        return frames  # the remainder joins the first batch

    def frame_rule(self, config: Any) -> str:
        return f"{self.frame_step(config)}k+1"

    def stream_batches(self, module: Any, latent_frames: int) -> list[tuple[int, int]]:
        per_batch = module.num_latent_frames_batch_size
        num_batches = max(latent_frames // per_batch, 1)
        extra = latent_frames % per_batch
        return [(0 if i == 0 else per_batch * i + extra, min(per_batch * (i + 1) + extra, latent_frames))
                for i in range(num_batches)]

    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        # One iteration of upstream's ``_decode`` loop.
        if module.post_quant_conv is not None:
            z = module.post_quant_conv(z)
        return module.decoder(z, conv_cache=None if first else cache)

    def tiling_keywords(self, module: Any) -> dict[str, Any]:
        return {
            "tile_sample_min_height": module.tile_sample_min_height,
            "tile_sample_min_width": module.tile_sample_min_width,
            "tile_overlap_factor_height": module.tile_overlap_factor_height,
            "tile_overlap_factor_width": module.tile_overlap_factor_width,
        }

    def tiles(self, module: Any, latent_hw: tuple[int, int]) -> bool:
        height, width = latent_hw
        return bool(module.use_tiling) and (width > module.tile_latent_min_width
                                            or height > module.tile_latent_min_height)

    def tiled_candidates(self, module: Any, latent_hw: tuple[int, int],
                         counts: Sequence[int] = (2, 3, 4, 6, 8)) -> list[tuple[str, dict[str, Any]]]:
        overlaps = (module.tile_overlap_factor_height, module.tile_overlap_factor_width)
        return list(tiling.tiles(latent_hw, self.spatial_scale(module.config), overlaps, counts))

    def from_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        # As the pipeline writes it: latents * (1 / scaling_factor).
        return z * np.float32(1.0 / config["scaling_factor"])

    def to_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        return z * np.float32(config["scaling_factor"])

    def unscaled_phrase(self, config: Any) -> str:
        return f"after dividing by the scaling factor {float(config['scaling_factor']):g}"

    def normalization_metadata(self, config: Any) -> dict[str, str]:
        return {"scaling_factor": repr(float(config["scaling_factor"]))}

    def sharded_outputs(self) -> tuple[type, ...]:
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d
        from diffusers.models.upsampling import CogVideoXUpsample3D

        # Every causal conv (the bulk of the compute), every norm, and every
        # upsampler (where width doubles).
        return (CogVideoXCausalConv3d, torch.nn.GroupNorm, CogVideoXUpsample3D)


COGVIDEOX = CogVideoX()
