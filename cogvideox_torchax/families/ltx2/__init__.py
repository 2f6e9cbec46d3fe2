"""LTX-2's VAE (`AutoencoderKLLTX2Video`: LTX-2 and LTX-2.3), and LTX-Video 0.9's beside it (`ltx_video`).

Upstream decodes and encodes the whole video in one call: no frame loop and
no cache, each causal convolution padding time by repeating the first frame
(and, in the non-causal decoder the releases use, the last). Nothing in it
mixes frames but those convolutions (its norms are per pixel), so one
program serves a video of any length with no scan, and its size does not
grow with the video. Pipelines hold latents ``(B, C, T, H, W)`` (after
unpacking them from tokens) normalised per channel by the VAE's
``latents_mean`` and ``latents_std`` buffers and ``scaling_factor``, and
denormalise before decoding; a timestep-conditioned decoder also takes the
decode timestep (``LTX2Pipeline``'s ``decode_timestep``, 0 by default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cogvideox_torchax.families import tiling
from cogvideox_torchax.families.base import Family
from cogvideox_torchax.families.ltx2 import config_check
from cogvideox_torchax.families.ltx2.presets import PRESETS

# The buffers its pipelines normalise latents by (state-dict keys of the VAE).
STATISTICS = ("latents_mean", "latents_std")


def _host(value: Any) -> Any:
    # A torch tensor (any device, any dtype) or anything numpy takes.
    return value.detach().float().cpu().numpy() if hasattr(value, "detach") else value


def _per_channel(values: Any, like: np.ndarray) -> np.ndarray:
    # (C,) -> (1, C, 1, 1, 1), float32, as the pipeline's view(1, -1, 1, 1, 1).
    return np.asarray(values, dtype=np.float32).reshape(1, -1, *([1] * (like.ndim - 2)))


class LTX2Video(Family):
    """`AutoencoderKLLTX2Video` (LTX-2, LTX-2.3)."""

    name = "ltx2"
    title = "LTX-2"
    class_name = "AutoencoderKLLTX2Video"
    presets = PRESETS
    default_model = "Lightricks/LTX-2"
    patch_package = "cogvideox_torchax.families.ltx2.patches"
    # LTX2Pipeline's frame_rate.
    fps = 24.0
    pipeline_layout = "BCTHW"
    # One batch, the whole video, as upstream decodes it: nothing to carry.
    stream_needs = None
    metadata_keys = (*STATISTICS, "scaling_factor")
    # LTX2Pipeline and its siblings read these from pipe.vae to (de)normalise.
    pipeline_buffers = STATISTICS
    normalization = "normalised per channel by the VAE's latents_mean and latents_std and its config.scaling_factor"

    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        config_check.check_config(config, source, self.class_name)

    def latent_channels(self, config: Any) -> int:
        return int(config["latent_channels"])

    def video_channels(self, config: Any) -> int:
        return int(config["in_channels"])

    def spatial_scale(self, config: Any) -> int:
        return config_check.spatial_scale(config, self.class_name)

    def frames_of(self, config: Any, latent_frames: int) -> int:
        return 1 + config_check.temporal_scale(config, self.class_name) * (latent_frames - 1)

    def frame_step(self, config: Any) -> int:
        return config_check.temporal_scale(config, self.class_name)

    def frames_read(self, config: Any, frames: int) -> int:
        # Upstream's encoder folds pairs of frames after repeating the first,
        # at each block that compresses time: only step k + 1 frames fit it
        # (others fail in upstream's reshape), its own step, which a config
        # may give otherwise than its decoder's.
        step = config_check.encoder_scales(config, self.class_name)[1]
        return (frames - 1) // step * step + 1

    def frame_rule(self, config: Any) -> str:
        return f"{self.frame_step(config)}k+1"

    def pipeline_word(self) -> str:
        return "denormalized"

    def stream_batches(self, module: Any, latent_frames: int) -> list[tuple[int, int]]:
        return [(0, latent_frames)]

    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        # The whole video in one call, as upstream's _decode without tiling.
        return module.decoder(z, *inputs), None

    def decode_inputs(self, config: Any) -> tuple[str, ...]:
        # A timestep-conditioned decoder takes the decode timestep after the
        # latents (upstream decode(z, temb)); an unconditioned one ignores it.
        return ("temb",) if config["timestep_conditioning"] else ()

    def decode_input_values(self, config: Any, batch: int, given: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        if not self.decode_inputs(config):
            return ()
        temb = given.get("temb")
        # LTX2Pipeline's decode_timestep is 0 unless set: one value, or one per video.
        values = np.asarray(0.0 if temb is None else _host(temb), dtype=np.float32).reshape(-1)
        if values.size not in (1, batch) or not np.isfinite(values).all():
            raise ValueError(f"temb must be a finite timestep, one or one per video ({batch}), got {values.tolist()}")
        return (np.ascontiguousarray(np.broadcast_to(values, (batch,))),)

    def draws_noise(self, config: Any) -> bool:
        # Noise-injecting decoder blocks draw torch.randn on every call (a lone bool stands for every block).
        noise = config_check.merged(config, self.class_name)["decoder_inject_noise"]
        return bool(noise) if isinstance(noise, bool) else any(noise)

    def check_call(self, config: Any, method: str, arguments: Mapping[str, Any]) -> None:
        # Upstream takes `causal or is_causal`: True asks for a causal pass of a
        # non-causal coder, which would need programs of its own.
        switches = {"decode": {"causal": "decoder_causal"}, "encode": {"causal": "encoder_causal"},
                    "forward": {"encoder_causal": "encoder_causal", "decoder_causal": "decoder_causal"}}
        for name, key in switches.get(method, {}).items():
            if arguments.get(name) and not config[key]:
                coder = key.removesuffix("_causal")
                raise ValueError(
                    f"{name}=True asks for a causal pass of this VAE's non-causal {coder}, which the wrapped VAE "
                    f"does not compile: build the upstream module with {key}=True in its config and wrap that"
                )

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
        # Upstream's tiles step by 7/8 of their size (512 pixels, stride 448).
        # A last tile of one latent is left out: reflection padding (the
        # released decoder's) needs two, and upstream's own decode fails there.
        def one_latent_left(tile: tuple[int, int], stride: tuple[int, int]) -> bool:
            return any((n - 1) % s == 0 and n > s for n, s in zip(latent_hw, stride, strict=True))

        return tiling.strided_candidates(latent_hw, module.spatial_compression_ratio, fraction=7 / 8, smallest=2,
                                         counts=counts, refused=one_latent_left)

    def normalization_source(self, vae: Any) -> Mapping[str, Any]:
        # The statistics are buffers, not config values: read from the weights.
        return {**vae.config, **{k: np.asarray(vae.weights[k], dtype=np.float32).tolist() for k in STATISTICS}}

    def from_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        # As LTX2Pipeline._denormalize_latents: latents * std / scaling_factor + mean.
        std, mean = _per_channel(config["latents_std"], z), _per_channel(config["latents_mean"], z)
        return z * std / np.float32(config["scaling_factor"]) + mean

    def to_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        # As LTX2ImageToVideoPipeline._normalize_latents: (latents - mean) * scaling_factor / std.
        std, mean = _per_channel(config["latents_std"], z), _per_channel(config["latents_mean"], z)
        return (z - mean) * np.float32(config["scaling_factor"]) / std

    def unscaled_phrase(self, config: Any) -> str:
        return "after denormalizing by the VAE's latents_mean and latents_std and its scaling factor"

    def normalization_metadata(self, config: Any) -> dict[str, str]:
        return {"latents_mean": repr([float(v) for v in config["latents_mean"]]),
                "latents_std": repr([float(v) for v in config["latents_std"]]),
                "scaling_factor": repr(float(config["scaling_factor"]))}

    def sharded_outputs(self) -> tuple[type, ...]:
        from diffusers.models.autoencoders.autoencoder_kl_ltx2 import (
            LTX2VideoCausalConv3d,
            LTX2VideoUpsampler3d,
            PerChannelRMSNorm,
        )

        return (LTX2VideoCausalConv3d, PerChannelRMSNorm, LTX2VideoUpsampler3d)


LTX2 = LTX2Video()
