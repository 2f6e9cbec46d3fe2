"""The checks of an `AutoencoderKLWan` config, before anything is built from it, and the geometry it implies."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from cogvideox_torchax.families.checks import MAX_INT, Checker, finite, is_int, positive_int

# Upstream's encode steps through the video 4 frames at a time (after a
# first frame alone), whatever the config says: only a temporal
# compression of 4 encodes and decodes consistently.
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
    """Video frames per latent frame after the first: a doubling per level that downsamples time."""
    c = merged(config)
    return 2 ** sum(bool(t) for t in c["temperal_downsample"][: len(c["dim_mult"]) - 1])


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Checks every value the architecture needs, before anything is built.

    Keys left out take upstream's defaults. What upstream would only trip
    over later (channel counts a patch size or a residual block's shortcut
    cannot split, a temporal compression its encode loop does not step by,
    a latents_std of 0 the pipeline divides by) is refused here, naming the
    key.

    Raises:
        ConfigError: naming the first bad key, its value and what it must be.
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
    levels = len(mult) - 1
    down = c["temperal_downsample"]
    check.require("temperal_downsample", isinstance(down, (list, tuple)) and len(down) == levels
                  and all(isinstance(t, bool) for t in down),
                  f"a list of {levels} true/false (one per level but the last)")
    check.require("temperal_downsample", sum(down) == 2,
                  f"two true: upstream's encode steps {TEMPORAL_SCALE} frames at a time, a temporal compression of "
                  f"{TEMPORAL_SCALE}")
    scales = c["attn_scales"]
    check.require("attn_scales", isinstance(scales, (list, tuple)) and all(finite(s) for s in scales),
                  "a list of numbers")
    check.require("dropout", finite(c["dropout"]) and 0 <= c["dropout"] < 1, "a number from 0 to below 1")
    check.require("is_residual", isinstance(c["is_residual"], bool), "true or false")
    patch = c["patch_size"]
    check.require("patch_size", patch is None or positive_int(patch), "null or a positive integer")
    for key in ("in_channels", "out_channels"):
        check.require(key, c[key] % (patch or 1) ** 2 == 0,
                      f"a multiple of patch_size squared ({(patch or 1) ** 2}): pixels are patchified into channels")
    for key in ("latents_mean", "latents_std"):
        v = c[key]
        check.require(key, isinstance(v, (list, tuple)) and len(v) == c["z_dim"] and all(finite(x) for x in v),
                      f"a list of z_dim ({c['z_dim']}) finite numbers")
    check.require("latents_std", all(x > 0 for x in c["latents_std"]),
                  "positive numbers (the pipeline divides latents by them)")
    space = 2**levels * (patch or 1)
    check.require("scale_factor_spatial", c["scale_factor_spatial"] == space and is_int(c["scale_factor_spatial"]),
                  f"{space}, the architecture's (2^{levels} levels x patch size {patch or 1}); upstream tiles by it")
    check.require("scale_factor_temporal", c["scale_factor_temporal"] in (None, TEMPORAL_SCALE)
                  and not isinstance(c["scale_factor_temporal"], bool), f"null or {TEMPORAL_SCALE}")
