"""The checks of an `AutoencoderKLHunyuanVideo15` config, before anything is built from it, and its geometry.

No stricter than upstream: what its constructor builds is taken
(`checks.check_builds`), and the geometry is read as upstream's decoder reads
the config: up block ``i`` resamples (space always, by its depth-to-space
fold) while ``i`` is below log2 of either ratio, and time too while below
log2 of ``temporal_compression_ratio``.
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

CLASS_NAME = "AutoencoderKLHunyuanVideo15"


def merged(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` over upstream's defaults (the release's values)."""
    return {**upstream_defaults(CLASS_NAME), **config}


def _log2(v: float) -> float:
    # np.log2, as upstream takes it: -inf at 0 (a ratio below another floors to 0).
    return math.log2(v) if v > 0 else -math.inf


def decoder_resamples(config: Mapping[str, Any]) -> list[tuple[bool, bool]]:
    """Each up block's (doubles time, doubles space), as upstream's decoder decides them."""
    c = merged(config)
    space, time = _log2(c["spatial_compression_ratio"]), _log2(c["temporal_compression_ratio"])
    return [(i < time, i < space or i < time) for i in range(len(c["block_out_channels"]))]


def encoder_resamples(config: Mapping[str, Any]) -> list[tuple[bool, bool]]:
    """Each down block's (halves time, halves space), as upstream's encoder decides them."""
    c = merged(config)
    ratio_s, ratio_t = c["spatial_compression_ratio"], c["temporal_compression_ratio"]
    space = _log2(ratio_s)
    return [(i < space and i >= _log2(ratio_s // ratio_t), i < space) for i in range(len(c["block_out_channels"]))]


def spatial_scale(config: Mapping[str, Any]) -> int:
    return 2 ** sum(space for _, space in decoder_resamples(config))


def temporal_scale(config: Mapping[str, Any]) -> int:
    return 2 ** sum(time for time, _ in decoder_resamples(config))


def scale_warnings(config: Mapping[str, Any]) -> list[str]:
    """What a config's ratios say against its architecture, and what upstream does with them."""
    c = merged(config)
    space, time = spatial_scale(c), temporal_scale(c)
    encoder_space = 2 ** sum(s for _, s in encoder_resamples(c))
    encoder_time = 2 ** sum(t for t, _ in encoder_resamples(c))
    notes = []
    ratios = c["spatial_compression_ratio"], c["temporal_compression_ratio"]
    if ratios != (space, time) or (encoder_space, encoder_time) != (space, time):
        notes.append(f"the ratios say {ratios[0]!r}x space and {ratios[1]!r}x time where the decoder expands "
                     f"{space}x and {time}x and the encoder compresses {encoder_space}x and {encoder_time}x; "
                     "upstream's tiling and pipelines size latents by the config's values, and so does this VAE")
    return notes


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Refuses what upstream's constructor refuses, and a scaling factor the pipelines cannot divide by.

    Raises:
        ConfigError: naming the key, its value and what it must be, or what
            upstream's constructor raised.
    """
    c = merged(config)
    check = Checker(c, source)
    for key in ("in_channels", "out_channels", "latent_channels", "layers_per_block"):
        check.require(key, positive_int(c[key]), f"an integer from 1 to {MAX_INT}")
    blocks = c["block_out_channels"]
    check.require("block_out_channels", isinstance(blocks, (list, tuple)) and bool(blocks)
                  and all(positive_int(v) for v in blocks), "a non-empty list of positive integers")
    for key in ("spatial_compression_ratio", "temporal_compression_ratio"):
        check.require(key, positive_int(c[key]), "a positive integer (upstream takes its log2)")
    check.require("scaling_factor", finite(c["scaling_factor"]) and c["scaling_factor"] != 0,
                  "a finite non-zero number (the pipelines divide latents by it)")
    from diffusers import AutoencoderKLHunyuanVideo15

    check_builds(AutoencoderKLHunyuanVideo15, c, source)
    for note in scale_warnings(c):
        warnings.warn(f"{CLASS_NAME} config: {note}", UserWarning, stacklevel=2)
