"""The checks of an `AutoencoderKLCogVideoX` config, before anything is built from it."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

from cogvideox_torchax.families.checks import MAX_INT, Checker, finite, is_int, is_number

_POSITIVE_INTS = ("in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups",
                  "sample_height", "sample_width")
_BLOCK_TYPES = {"down_block_types": "CogVideoXDownBlock3D", "up_block_types": "CogVideoXUpBlock3D"}
_FLAGS = ("use_quant_conv", "use_post_quant_conv", "invert_scale_latents")


@functools.cache
def defaults() -> dict[str, Any]:
    """Upstream's defaults for the keys a config may leave out."""
    from diffusers import AutoencoderKLCogVideoX

    params = inspect.signature(AutoencoderKLCogVideoX.__init__).parameters
    return {k: v.default for k, v in params.items() if k != "self"}


def time_levels(config: Mapping[str, Any]) -> int:
    """How many resamplers halve (encoder) or double (decoder) time, as upstream's constructors count them.

    ``int(log2(temporal_compression_ratio))`` of the first resamplers, of
    which there are one fewer than blocks: 2 for every released config
    (ratio 4), whose latent frames then decode to 1, 4 T or 4 T - 3 frames.
    """
    merged = {**defaults(), **config}
    level = int(math.log2(float(merged["temporal_compression_ratio"])))
    return max(0, min(level, len(merged["block_out_channels"]) - 1))


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Checks every value the architecture needs, before anything is built.

    Keys left out take upstream's defaults. What diffusers would only trip
    over later (a division by ``norm_num_groups`` 0, an empty
    ``block_out_channels``, ``log2`` of a ``temporal_compression_ratio`` 0, a
    ``scaling_factor`` 0 the latents are divided by) is refused here.

    Raises:
        ConfigError: naming the first bad key, its value and what it must be.
    """
    from diffusers.models.activations import ACT2CLS

    merged = {**defaults(), **config}
    check = Checker(merged, source)
    for key in _POSITIVE_INTS:
        v = merged[key]
        check.require(key, is_int(v) and 1 <= v <= MAX_INT, f"an integer from 1 to {MAX_INT}")
    blocks = merged["block_out_channels"]
    check.require("block_out_channels", isinstance(blocks, (list, tuple)) and bool(blocks)
                  and all(is_int(c) and 1 <= c <= MAX_INT for c in blocks), "a non-empty list of positive integers")
    groups = merged["norm_num_groups"]
    check.require("block_out_channels", not any(c % groups for c in blocks),
                  f"channel counts divisible by norm_num_groups ({groups})")
    for key, name in _BLOCK_TYPES.items():
        types = merged[key]
        check.require(key, isinstance(types, (list, tuple)) and len(types) == len(blocks)
                      and all(t == name for t in types),
                      f"a list of {len(blocks)} {name!r} (one per block_out_channels entry)")
    # Upstream compresses time at its first int(log2(ratio)) resamplers (of
    # one fewer than its blocks): any positive ratio is taken, as upstream
    # takes it (`time_levels`); at 0 or below its constructor's log2 fails.
    ratio = merged["temporal_compression_ratio"]
    check.require("temporal_compression_ratio", finite(ratio) and float(ratio) > 0,
                  "a number above 0 (upstream compresses time at its first int(log2(ratio)) resamplers)")
    for key in ("scaling_factor", "norm_eps"):
        v = merged[key]
        # The latents are divided by the scaling factor: its inverse must be finite too.
        check.require(key, finite(v) and v > 0 and math.isfinite(1.0 / float(v)),
                      "a finite number above 0 (with a finite inverse)")
    shift = merged["shift_factor"]
    check.require("shift_factor", shift is None or finite(shift), "null or a finite number")
    for key in ("latents_mean", "latents_std"):
        v = merged[key]
        check.require(key, v is None or (isinstance(v, (list, tuple)) and all(finite(x) for x in v)),
                      "null or a list of finite numbers")
    check.require("act_fn", merged["act_fn"] in ACT2CLS, f"one of {', '.join(sorted(ACT2CLS))}")
    for key in _FLAGS:
        check.require(key, isinstance(merged[key], bool), "true or false")
    check.require("force_upcast", isinstance(merged["force_upcast"], bool) or is_number(merged["force_upcast"]),
                  "true or false")
