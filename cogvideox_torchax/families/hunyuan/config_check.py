"""The checks of an `AutoencoderKLHunyuanVideo` config, before anything is built from it, and the geometry it implies.

No stricter than upstream (docs/configs.md): what upstream's constructor
builds is taken (`checks.check_builds` is the judge of structure), and the
geometry is read the way upstream's encoder and decoder read the config:
a block resamples space while its index is below log2 of
``spatial_compression_ratio``, and time in the blocks before the last that
its temporal rule picks, so a config whose ratios disagree with its block
count runs as upstream runs it, with one warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from cogvideox_torchax.families.checks import (
    MAX_INT,
    Checker,
    check_builds,
    finite,
    positive_int,
    upstream_defaults,
)

CLASS_NAME = "AutoencoderKLHunyuanVideo"


def merged(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` over upstream's defaults (the release's values)."""
    return {**upstream_defaults(CLASS_NAME), **config}


def _levels(ratio: int) -> int:
    # int(np.log2(ratio)), as upstream takes it.
    return int(math.log2(ratio))


def decoder_resamples(config: Mapping[str, Any]) -> list[tuple[bool, bool]]:
    """Each up block's (doubles time, doubles space), as upstream's decoder decides them."""
    c = merged(config)
    blocks = len(c["block_out_channels"])
    space = _levels(c["spatial_compression_ratio"])
    time = _levels(c["temporal_compression_ratio"])
    return [(blocks - 1 - time <= i < blocks - 1, i < space) for i in range(len(c["up_block_types"]))]


def encoder_resamples(config: Mapping[str, Any]) -> list[tuple[bool, bool]]:
    """Each down block's (halves time, halves space), as upstream's encoder decides them (time ratio 4 or 8)."""
    c = merged(config)
    blocks = len(c["block_out_channels"])
    space = _levels(c["spatial_compression_ratio"])
    time = _levels(c["temporal_compression_ratio"])
    if c["temporal_compression_ratio"] == 8:
        return [(i < time, i < space) for i in range(len(c["down_block_types"]))]
    return [(blocks - 1 - time <= i < blocks - 1, i < space) for i in range(len(c["down_block_types"]))]


def spatial_scale(config: Mapping[str, Any]) -> int:
    """Video pixels per latent pixel: a doubling per up block that resamples space."""
    return 2 ** sum(space for _, space in decoder_resamples(config))


def temporal_scale(config: Mapping[str, Any]) -> int:
    """Video frames the decoder gives each latent frame after the first: a doubling per up block resampling time."""
    return 2 ** sum(time for time, _ in decoder_resamples(config))


# Upstream's default frame windows, in video frames: tile_sample_min_num_frames and tile_sample_stride_num_frames.
WINDOW, WINDOW_STRIDE = 16, 12


def windowed_frames(config: Mapping[str, Any], latent_frames: int) -> int:
    """The frames upstream's default decode gives ``latent_frames`` latent frames (its windows as set by default).

    Up to ``16 // ratio`` latent frames, one decoder call: ``1 + scale (T - 1)``.
    Past them, windows of ``16 // ratio + 1`` latent frames every ``12 // ratio``,
    each decoding to ``1 + scale (L - 1)`` frames; the first keeps 13, the
    others drop their first and keep 12; the whole is cut to
    ``(T - 1) ratio + 1``. ``ratio`` is the config's, ``scale`` the decoder's.
    """
    ratio, scale = merged(config)["temporal_compression_ratio"], temporal_scale(config)
    size, stride = WINDOW // ratio, WINDOW_STRIDE // ratio
    if latent_frames <= size or stride < 1:
        return 1 + scale * (latent_frames - 1)
    total = 0
    for n, start in enumerate(range(0, latent_frames, stride)):
        decoded = 1 + scale * (min(size + 1, latent_frames - start) - 1)
        total += min(decoded, WINDOW_STRIDE + 1) if n == 0 else min(decoded - 1, WINDOW_STRIDE)
    return min(total, (latent_frames - 1) * ratio + 1)


def scale_warnings(config: Mapping[str, Any]) -> list[str]:
    """What a config's ratios say against its architecture, and what upstream does with them."""
    c = merged(config)
    notes = []
    space, time = spatial_scale(c), temporal_scale(c)
    encoder_space = 2 ** sum(s for _, s in encoder_resamples(c))
    encoder_time = 2 ** sum(t for t, _ in encoder_resamples(c))
    if c["spatial_compression_ratio"] != space or encoder_space != space:
        notes.append(f"spatial_compression_ratio is {c['spatial_compression_ratio']!r} where the decoder expands "
                     f"space {space}x (the encoder compresses it {encoder_space}x); upstream's tiling and its "
                     "pipelines size latents by the config's value, and so does this VAE (upstream's attribute, "
                     "kept)")
    if c["temporal_compression_ratio"] != time or encoder_time != time:
        notes.append(f"temporal_compression_ratio is {c['temporal_compression_ratio']!r} where the decoder expands "
                     f"time {time}x (the encoder compresses it {encoder_time}x); upstream's frame windows and its "
                     "pipelines count frames by the config's value, and so does this VAE")
    return notes


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Refuses what upstream's constructor refuses, and a scaling factor the pipelines cannot divide by.

    Keys left out take upstream's defaults. Ratios that disagree with the
    block count are taken, as upstream takes them, with one warning each
    (`scale_warnings`).

    Raises:
        ConfigError: naming the key, its value and what it must be, or what
            upstream's constructor raised.
    """
    c = merged(config)
    check = Checker(c, source)
    for key in ("in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups"):
        check.require(key, positive_int(c[key]), f"an integer from 1 to {MAX_INT}")
    for key in ("block_out_channels", "down_block_types", "up_block_types"):
        v = c[key]
        check.require(key, isinstance(v, (list, tuple)) and bool(v), "a non-empty list")
    check.require("block_out_channels", all(positive_int(v) for v in c["block_out_channels"]),
                  "a list of positive integers")
    for key in ("spatial_compression_ratio", "temporal_compression_ratio"):
        check.require(key, positive_int(c[key]), "a positive integer (upstream takes its log2)")
    check.require("scaling_factor", finite(c["scaling_factor"]) and c["scaling_factor"] != 0,
                  "a finite non-zero number (the pipelines divide latents by it)")
    from diffusers import AutoencoderKLHunyuanVideo

    check_builds(AutoencoderKLHunyuanVideo, c, source)
    for note in scale_warnings(c):
        warnings.warn(f"{CLASS_NAME} config: {note}", UserWarning, stacklevel=2)
