"""The checks of an `AutoencoderKLWan` config, before anything is built from it, and the geometry it implies.

No stricter than upstream (docs/configs.md): a config upstream's constructor
builds is taken, what upstream trips over when it runs is refused where it
refuses it (`vae.as_upstream`), and scale factors that disagree with the
architecture are upstream's quirk, kept with one warning. Refused besides:
latents statistics the pipelines cannot use (one per latent channel, a
standard deviation they divide by).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from cogvideox_torchax.families.checks import MAX_INT, Checker, check_builds, finite, positive_int

# Upstream's encode steps through the video 4 frames at a time (after a
# first frame alone), whatever the config says; its decoder gives each
# later latent frame 2^(levels that upsample time) frames (`temporal_scale`).
TEMPORAL_SCALE = 4


@functools.cache
def defaults() -> dict[str, Any]:
    """Upstream's defaults for the keys a config may leave out (Wan 2.1's values)."""
    from diffusers import AutoencoderKLWan

    params = inspect.signature(AutoencoderKLWan.__init__).parameters
    return {k: v.default for k, v in params.items() if k != "self"}


def merged(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` over upstream's defaults."""
    return {**defaults(), **config}


def spatial_scale(config: Mapping[str, Any]) -> int:
    """Video pixels per latent pixel: one halving per level after the first, times the patch size."""
    c = merged(config)
    return 2 ** (len(c["dim_mult"]) - 1) * (c["patch_size"] or 1)


def temporal_scale(config: Mapping[str, Any]) -> int:
    """Video frames the decoder gives each latent frame after the first: a doubling per level that upsamples time.

    As upstream's decoder reads it: ``temperal_downsample`` reversed, its
    first entries one per level.
    """
    c = merged(config)
    return 2 ** sum(bool(t) for t in list(reversed(list(c["temperal_downsample"])))[: len(c["dim_mult"]) - 1])


def encoder_temporal_scale(config: Mapping[str, Any]) -> int:
    """What the encoder compresses time by: a halving per level whose ``temperal_downsample`` is true."""
    c = merged(config)
    return 2 ** sum(bool(t) for t in list(c["temperal_downsample"])[: len(c["dim_mult"]) - 1])


def scale_warnings(config: Mapping[str, Any]) -> list[str]:
    """What a config's scale factors say against its architecture, and what upstream does with them."""
    c = merged(config)
    notes = []
    space, time = spatial_scale(c), encoder_temporal_scale(c)
    if c["scale_factor_spatial"] != space:
        notes.append(f"scale_factor_spatial is {c['scale_factor_spatial']!r} where the architecture compresses "
                     f"{space}x; upstream's tiling (spatial_compression_ratio) and its pipelines size latents by "
                     f"the config's value, and so does this VAE (upstream's attribute, kept)")
    if c["scale_factor_temporal"] not in (None, time):
        notes.append(f"scale_factor_temporal is {c['scale_factor_temporal']!r} where the encoder compresses time "
                     f"{time}x; upstream's pipelines size latents by the config's value")
    if time != TEMPORAL_SCALE or temporal_scale(c) != time:
        notes.append(f"the encoder compresses time {time}x and the decoder expands it {temporal_scale(c)}x, while "
                     f"upstream's encode steps {TEMPORAL_SCALE} frames at a time: frame counts do not round-trip, "
                     "as upstream's do not")
    return notes


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Refuses what upstream's constructor refuses, and latents statistics the pipelines cannot use.

    Keys left out take upstream's defaults. Scale factors and temporal
    downsampling that disagree with the architecture or with upstream's
    four-frame encode are taken, as upstream takes them, with one warning
    each (`scale_warnings`).

    Raises:
        ConfigError: naming the key, its value and what it must be, or what
            upstream's constructor raised.
    """
    c = merged(config)
    check = Checker(c, source)
    for key in ("base_dim", "z_dim", "num_res_blocks", "in_channels", "out_channels"):
        check.require(key, positive_int(c[key]), f"an integer from 1 to {MAX_INT}")
    check.require("decoder_base_dim", c["decoder_base_dim"] is None or positive_int(c["decoder_base_dim"]),
                  f"null or an integer from 1 to {MAX_INT}")
    mult = c["dim_mult"]
    check.require("dim_mult", isinstance(mult, (list, tuple)) and bool(mult) and all(positive_int(m) for m in mult),
                  "a non-empty list of positive integers")
    down = c["temperal_downsample"]
    check.require("temperal_downsample", isinstance(down, (list, tuple)) and all(isinstance(t, bool) for t in down),
                  "a list of true/false (one per level but the last)")
    scales = c["attn_scales"]
    check.require("attn_scales", isinstance(scales, (list, tuple)) and all(finite(s) for s in scales),
                  "a list of numbers")
    check.require("dropout", finite(c["dropout"]) and 0 <= c["dropout"] <= 1, "a number from 0 to 1")
    check.require("is_residual", isinstance(c["is_residual"], bool), "true or false")
    patch = c["patch_size"]
    check.require("patch_size", patch is None or positive_int(patch), "null or a positive integer")
    for key in ("latents_mean", "latents_std"):
        v = c[key]
        check.require(key, isinstance(v, (list, tuple)) and len(v) == c["z_dim"] and all(finite(x) for x in v),
                      f"a list of z_dim ({c['z_dim']}) finite numbers (the pipelines normalise each latent channel)")
    check.require("latents_std", all(x > 0 for x in c["latents_std"]),
                  "positive numbers (the pipeline divides latents by them)")
    for key in ("scale_factor_spatial", "scale_factor_temporal"):
        check.require(key, c[key] is None or positive_int(c[key]), "null or a positive integer")
    from diffusers import AutoencoderKLWan

    check_builds(AutoencoderKLWan, c, source)
    for note in scale_warnings(c):
        warnings.warn(f"AutoencoderKLWan config: {note}", UserWarning, stacklevel=2)  # once, whichever file
