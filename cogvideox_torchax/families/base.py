"""What the runtime, planner, streaming, commands and I/O need to know of a model family: the `Family` record.

A family is one upstream VAE class of diffusers and the configs published
for it. Its record says how to recognise it (the class, ``config.json``'s
``_class_name``), its named presets, its latent geometry (channels, spatial
and temporal compression), how upstream batches frames and carries the
causal convolutions' caches from batch to batch (the stream's batches), how
its pipelines hold latents (layout, scaling or normalisation), its tiling
switches and its commands' defaults. Its own patches live in its folder and
name it in their `cogvideox_torchax.patches.base.Patch` records. Nothing
outside a family's folder tests a class name or a family's frame rule.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np


class Family(abc.ABC):
    """One model family: an upstream VAE class and everything the project needs to know of it.

    Attributes:
        name: the key (``"cogvideox"``, ``"wan"``), as patches name it.
        title: how messages and docs name it.
        class_name: the upstream class's name in diffusers (``config.json``'s ``_class_name``).
        presets: named published configs (and a tiny test config), for
            ``random_upstream`` and ``random:NAME`` models.
        default_model: the hub id the commands load by default.
        patch_package: the package of its own patch modules
            (``"cogvideox_torchax.families.<name>.patches"``), found by
            `cogvideox_torchax.patches.registry` beside the shared ones.
        fps: the commands' default mp4 frame rate (its models' own).
        pipeline_layout: how its pipelines hold latents, ``"BCTHW"`` or ``"BTCHW"``.
        normalization: how its pipelines scale latents, in words (for messages).
        metadata_keys: the keys of `normalization_metadata`, which mark a
            latents file as this family's.
        stream_needs: the switch without which the first batch's caches
            differ in shape from the later ones' (no stream, no scan); None
            for a family whose upstream decodes the whole video in one call
            (one batch, nothing carried).
        pipeline_buffers: buffers of upstream's module that its pipelines
            read from the VAE (LTX-2's ``latents_mean`` and ``latents_std``):
            the wrapped VAE answers them with host copies of its weights,
            where it refuses every other tensor.
        untiled_settings: upstream's settings that turn its frame windows
            off (the whole video through the decoder and encoder at once:
            the commands' ``--untiled``); empty for a family whose default
            decode is that already, None for one with no such decode.
    """

    name: str
    title: str
    class_name: str
    presets: Mapping[str, Mapping[str, Any]]
    default_model: str
    patch_package: str
    fps: float
    pipeline_layout: str = "BCTHW"
    normalization: str = "multiplied by config.scaling_factor"
    metadata_keys: tuple[str, ...] = ("scaling_factor",)
    stream_needs: str | None = None
    pipeline_buffers: tuple[str, ...] = ()
    untiled_settings: Mapping[str, Any] | None = None

    @property
    def upstream(self) -> type:
        """The upstream class (diffusers is imported on first use)."""
        return getattr(importlib.import_module("diffusers"), self.class_name)

    def is_module(self, module: Any) -> bool:
        """Whether ``module`` is this family's upstream module (or a patched one)."""
        return any(cls.__name__ == self.class_name and cls.__module__.startswith("diffusers.")
                   for cls in type(module).__mro__)

    # -- the config ---------------------------------------------------------

    @abc.abstractmethod
    def check_config(self, config: Mapping[str, Any], source: str = "config") -> None:
        """Checks every value the architecture needs before anything is built.

        Raises:
            cogvideox_torchax.families.checks.ConfigError: naming the first
                bad key, its value and what it must be.
        """

    def latent_channels(self, config: Any) -> int:
        """The channels of the latents ``decode`` takes (``config.latent_channels`` unless a family says otherwise)."""
        return int(config["latent_channels"])

    def video_channels(self, config: Any) -> int:
        """The channels of the video ``encode`` takes and ``decode`` returns (``config.in_channels``)."""
        return int(config["in_channels"])

    @abc.abstractmethod
    def spatial_scale(self, config: Any) -> int:
        """Video pixels per latent pixel, along height and width."""

    # -- frames -------------------------------------------------------------

    @abc.abstractmethod
    def frames_of(self, config: Any, latent_frames: int) -> int:
        """How many video frames ``latent_frames`` latent frames decode to."""

    @abc.abstractmethod
    def frame_step(self, config: Any) -> int:
        """Video frames per latent frame after the first: the counts ``step k + 1`` round-trip."""

    def round_trip_frames(self, config: Any, available: int) -> int:
        """The most frames, at most ``available``, that encode to latents decoding back to as many frames."""
        step = self.frame_step(config)
        return (available - 1) // step * step + 1

    def frames_read(self, config: Any, frames: int) -> int:
        """How many frames of a ``frames``-frame video upstream's encode reads (it may drop the last ones; all)."""
        return frames

    def frame_rule(self, config: Any) -> str:
        """The frame counts that round-trip, in words (``"8k+1"``: the frame step's)."""
        return f"{self.frame_step(config)}k+1"

    def pipeline_word(self) -> str:
        """What undoing the pipeline's scaling is called in summaries (``"unscaled"``, ``"denormalized"``)."""
        return "unscaled"

    def unscaled_phrase(self, config: Any) -> str:
        """How messages say the pipeline's scaling was undone (``"after dividing by the scaling factor 0.7"``)."""
        return f"after dividing by the scaling factor {float(config['scaling_factor']):g}"

    def stream_batches(self, module: Any, latent_frames: int) -> list[tuple[int, int]]:
        """Upstream's ``[start, stop)`` latent frame batches of the decode, in order (the whole video in one)."""
        return [(0, latent_frames)]

    @abc.abstractmethod
    def decode_batch(self, module: Any, z: Any, cache: Any, first: bool, *inputs: Any) -> tuple[Any, Any]:
        """One batch of upstream's decode loop under torchax: ``(video frames, cache for the next batch)``.

        ``inputs``: the values of `decode_inputs`, in its order.

        ``cache`` is what the previous batch returned (None for the first);
        its structure is the family's and does not change between batches
        after the first, so the batches after the first are one program.
        """

    def decode_inputs(self, config: Any) -> tuple[str, ...]:
        """The per-video inputs of upstream's decode besides the latents, in its order (LTX-2's timestep ``temb``).

        Each is a ``(B,)`` array the decode programs take after the latents;
        a family whose decode takes none returns ``()`` (its programs are
        unchanged by this hook).
        """
        return ()

    def decode_input_values(self, config: Any, batch: int, given: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        """`decode_inputs`' values for a batch of ``batch`` videos: as given, else as the family's pipelines pass them.

        Raises:
            ValueError: a value that is not one number per video.
        """
        return ()

    def draws_noise(self, config: Any) -> bool:
        """Whether upstream's decode draws from torch's global generator (LTX's decoder noise injection).

        Where it does, each call draws on the host as upstream would and the
        programs take the draws after the decode inputs
        (`cogvideox_torchax.vae.drawn_noise`).
        """
        return False

    def check_call(self, config: Any, method: str, arguments: Mapping[str, Any]) -> None:
        """Refuses arguments of upstream's ``decode``, ``encode`` or ``forward`` that the wrapped VAE cannot honour.

        ``arguments`` are the call's, bound to upstream's signature.

        Raises:
            ValueError: naming the argument and what to do instead.
        """
        return None

    # -- tiling -------------------------------------------------------------

    def tiling_keywords(self, module: Any) -> dict[str, Any]:
        """``enable_tiling`` keywords that reproduce ``module``'s tiling as set (its ``tile_sample_*`` attributes)."""
        return {k: v for k, v in vars(module).items() if k.startswith("tile_sample_")}

    def tiles(self, module: Any, latent_hw: tuple[int, int]) -> bool:
        """Whether upstream's decode tiles latents of this frame size as ``module`` is set.

        By default as upstream's ``_decode`` tests it where tiles are sized in
        video pixels: tiling on, and the latent frame larger than a tile.
        """
        height, width = latent_hw
        ratio = module.spatial_compression_ratio
        return bool(module.use_tiling) and (width > module.tile_sample_min_width // ratio
                                            or height > module.tile_sample_min_height // ratio)

    @abc.abstractmethod
    def tiled_candidates(self, module: Any, latent_hw: tuple[int, int]) -> list[tuple[str, dict[str, Any]]]:
        """Tilings for a latent frame size, in order of growing tile counts: ``(name, enable_tiling keywords)``.

        Each makes upstream's tiled decode return the whole video's size.
        """

    # -- the pipelines' latents ---------------------------------------------

    def normalization_source(self, vae: Any) -> Mapping[str, Any]:
        """What `from_pipeline`, `to_pipeline` and the messages read the pipelines' scaling from (``vae.config``).

        A family whose statistics are the VAE's buffers rather than config
        values (LTX-2's ``latents_mean`` / ``latents_std``) adds them here
        from ``vae.weights``.
        """
        return vae.config

    def from_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        """Latents ``(B, C, T, H, W)`` as the pipeline holds them -> what ``vae.decode`` takes (float32).

        By default divided by ``config.scaling_factor``, as most pipelines write it.
        """
        return z / np.float32(config["scaling_factor"])

    def to_pipeline(self, z: np.ndarray, config: Any) -> np.ndarray:
        """Encoder latents ``(B, C, T, H, W)`` -> as the pipeline holds them (float32, still ``(B, C, T, H, W)``)."""
        return z * np.float32(config["scaling_factor"])

    def normalization_metadata(self, config: Any) -> dict[str, str]:
        """What the encode command records of the normalisation in the latents file's metadata."""
        return {"scaling_factor": repr(float(config["scaling_factor"]))}

    # -- sharding -----------------------------------------------------------

    @abc.abstractmethod
    def sharded_outputs(self) -> tuple[type, ...]:
        """The module classes whose outputs are constrained to split width over ``tp`` (``shard_activations``)."""

    def __repr__(self) -> str:
        return f"<family {self.name}: {self.class_name}>"
