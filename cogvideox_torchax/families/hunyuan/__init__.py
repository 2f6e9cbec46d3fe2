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
    # Upstream's switches of its frame windows: off, the whole video in one decoder (encoder) call.
    untiled_settings = MappingProxyType({"use_framewise_decoding": False, "use_framewise_encoding": False})

    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        config_check.check_config(config, source)

    def spatial_scale(self, config: Any) -> int:
        return config_check.spatial_scale(config)

    def frames_of(self, config: Any, latent_frames: int) -> int:
        # Each time-doubling upsampler keeps the first frame and doubles the rest; past one window, upstream's
        # default frame windows keep and crop by the config's ratio (the same count where the ratio is the
        # decoder's own).
        return config_check.windowed_frames(config, latent_frames)

    def frame_step(self, config: Any) -> int:
        return config_check.temporal_scale(config)

    # Its pipelines hold latents (B, C, T, H, W) multiplied by scaling_factor (the record's defaults): divided by it
    # before decoding (HunyuanVideoPipeline), multiplied after encoding (its image-to-video). One batch, the whole
    # video, as upstream decodes it: its windows carry nothing from one to the next.

    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        # The whole video as upstream's _decode (its windows where it takes them).
        return module._decode(z, return_dict=False)[0], None

    def tiled_candidates(self, module: Any, latent_hw: tuple[int, int],
                         counts: Sequence[int] = tiling.COUNTS) -> list[tuple[str, dict[str, Any]]]:
        # Upstream's tiles step by 3/4 of their size (256 pixels, stride 192).
        return tiling.strided_candidates(latent_hw, module.spatial_compression_ratio, fraction=3 / 4, smallest=4,
                                         counts=counts)

    def sharded_outputs(self) -> tuple[type, ...]:
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (
            HunyuanVideoCausalConv3d,
            HunyuanVideoUpsampleCausal3D,
        )

        return (HunyuanVideoCausalConv3d, torch.nn.GroupNorm, HunyuanVideoUpsampleCausal3D)


HUNYUAN = HunyuanVideo()
