"""The checks of an `AutoencoderKLLTX2Video` config, before anything is built from it, and the geometry it implies.

Upstream builds any config and fails only when a tensor of the wrong
channel count reaches a layer, so the check walks the channels the way
upstream's encoder and decoder constructors hand them on and names the key
where they stop fitting. It also refuses what would run but not as the
config says: compression ratios that differ from the architecture's (the
pipelines size latents by them), and noise injection (upstream draws it
from torch's global generator on every call, which no other runtime can
reproduce).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

from cogvideox_torchax.families.checks import MAX_INT, Checker, finite, is_int, positive_int

# Upstream's block kinds and the strides (time, height, width) each scales by.
DOWNSAMPLE_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2), "conv": (2, 2, 2)}
UPSAMPLE_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


@functools.cache
def defaults() -> dict[str, Any]:
    """Upstream's defaults for the keys a config may leave out."""
    from diffusers import AutoencoderKLLTX2Video

    params = inspect.signature(AutoencoderKLLTX2Video.__init__).parameters
    return {k: v.default for k, v in params.items() if k != "self"}


def merged(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` over upstream's defaults."""
    return {**defaults(), **config}


def _per_block(value: Any, count: int) -> list[Any]:
    # Upstream widens a lone bool to one per block.
    return [value] * count if isinstance(value, bool) else list(value)


def decoder_blocks(config: Mapping[str, Any]) -> list[tuple[bool, str, int, bool]]:
    """The decoder's up blocks in the order they run: ``(scales, upsample_type, upsample_factor, residual)``."""
    c = merged(config)
    n = len(c["decoder_layers_per_block"]) - 1
    scaling = _per_block(c["decoder_spatio_temporal_scaling"], n)
    residual = _per_block(c["upsample_residual"], n)
    return list(zip(reversed(scaling), reversed(list(c["upsample_type"])), reversed(list(c["upsample_factor"])),
                    reversed(residual), strict=False))


def spatial_scale(config: Mapping[str, Any]) -> int:
    """Video pixels per latent pixel: the patch size times each spatial doubling of the decoder."""
    c = merged(config)
    ups = [UPSAMPLE_STRIDES[kind][1] for scales, kind, _, _ in decoder_blocks(c) if scales]
    return int(c["patch_size"]) * math.prod(ups)


def temporal_scale(config: Mapping[str, Any]) -> int:
    """Video frames per latent frame after the first: each temporal doubling of the decoder (first frame kept)."""
    c = merged(config)
    ups = [UPSAMPLE_STRIDES[kind][0] for scales, kind, _, _ in decoder_blocks(c) if scales]
    return int(c["patch_size_t"]) * math.prod(ups)


def _encoder_scales(c: Mapping[str, Any]) -> tuple[int, int]:
    n = len(c["block_out_channels"])
    scaling = _per_block(c["spatio_temporal_scaling"], n)
    strides = [DOWNSAMPLE_STRIDES[c["downsample_type"][i]] for i in range(n) if scaling[i]]
    return (int(c["patch_size"]) * math.prod(s[1] for s in strides),
            int(c["patch_size_t"]) * math.prod(s[0] for s in strides))


def _check_lists(c: Mapping[str, Any], check: Checker) -> None:
    def ints(key: str, length: int | None = None) -> None:
        v = c[key]
        ok = isinstance(v, (list, tuple)) and bool(v) and all(positive_int(x) for x in v)
        check.require(key, ok and (length is None or len(v) == length),
                      "a non-empty list of positive integers" + (f", {length} of them" if length else ""))

    def bools(key: str, length: int) -> None:
        v = c[key]
        ok = isinstance(v, bool) or (isinstance(v, (list, tuple)) and len(v) == length
                                     and all(isinstance(x, bool) for x in v))
        check.require(key, ok, f"true, false or a list of {length} of them")

    def kinds(key: str, known: Mapping[str, Any], length: int) -> None:
        v = c[key]
        ok = isinstance(v, (list, tuple)) and len(v) == length and all(x in known for x in v)
        check.require(key, ok, f"a list of {length} of {', '.join(map(repr, known))}")

    ints("block_out_channels")
    n = len(c["block_out_channels"])
    ints("layers_per_block", n + 1)
    check.require("down_block_types", isinstance(c["down_block_types"], (list, tuple))
                  and list(c["down_block_types"]) == ["LTX2VideoDownBlock3D"] * n,
                  f"a list of {n} 'LTX2VideoDownBlock3D' (one per block_out_channels)")
    bools("spatio_temporal_scaling", n)
    kinds("downsample_type", DOWNSAMPLE_STRIDES, n)
    ints("decoder_block_out_channels")
    m = len(c["decoder_block_out_channels"])
    ints("decoder_layers_per_block", m + 1)
    bools("decoder_spatio_temporal_scaling", m)
    kinds("upsample_type", UPSAMPLE_STRIDES, m)
    bools("upsample_residual", m)
    ints("upsample_factor", m)
    bools("decoder_inject_noise", m + 1)


def _check_encoder_channels(c: Mapping[str, Any], check: Checker) -> None:
    # As LTX2VideoEncoder3d.__init__ hands channels on: conv_in to latent_channels, then each block.
    channels = int(c["latent_channels"])
    scaling = _per_block(c["spatio_temporal_scaling"], len(c["block_out_channels"]))
    for i, out in enumerate(c["block_out_channels"]):
        kind = c["downsample_type"][i]
        if not scaling[i] or kind == "conv":
            # No downsampler, or one that keeps its input's channels: the next block must take them.
            check.require("block_out_channels", out == channels,
                          f"{channels} at block {i} (its downsampler keeps its {channels} input channels)")
            continue
        volume = math.prod(DOWNSAMPLE_STRIDES[kind])
        check.require("block_out_channels", out % volume == 0 and (channels * volume) % out == 0,
                      f"at block {i}, a multiple of {volume} dividing {channels * volume} (a {kind} downsampler "
                      f"folds {volume} pixels of {channels} channels into them)")
        channels = out


def _check_decoder_channels(c: Mapping[str, Any], check: Checker) -> None:
    # As LTX2VideoDecoder3d.__init__ hands channels on (its lists reversed): up block i
    # is built for (arriving // factor) -> (its out // factor) channels, its upsampler
    # for out x factor of them.
    outs = list(reversed(c["decoder_block_out_channels"]))
    channels = outs[0]
    for i, (scales, kind, factor, residual) in enumerate(decoder_blocks(c)):
        block_in, block_out = channels // factor, outs[i] // factor
        check.require("decoder_block_out_channels", block_out > 0,
                      f"at up block {i}, at least upsample_factor ({factor}) channels")
        if block_in != block_out:
            check.require("upsample_factor", factor == 1,
                          f"1 at up block {i}: its first resnet takes {block_in} channels where {channels} arrive")
            channels = block_out
        if not scales:
            check.require("upsample_factor", channels == block_out,
                          f"1 at up block {i}: without an upsampler its resnets take {block_out} channels "
                          f"where {channels} arrive")
            continue
        volume = math.prod(UPSAMPLE_STRIDES[kind])
        check.require("upsample_factor", channels == block_out * factor and volume % factor == 0,
                      f"at up block {i}, a divisor of the {channels} channels arriving and of {volume} "
                      f"({kind} upsampling unfolds {volume} pixels)")
        if residual:
            check.require("upsample_residual", channels % volume == 0,
                          f"false at up block {i}: its residual unfolds {channels} channels into {volume} pixels")
        channels = block_out


def check_config(config: Mapping[str, Any], source: str = "config") -> None:
    """Checks every value the architecture needs, before anything is built.

    Keys left out take upstream's defaults.

    Raises:
        ConfigError: naming the first bad key, its value and what it must be.
    """
    c = merged(config)
    check = Checker(c, source)
    for key in ("in_channels", "out_channels", "latent_channels", "patch_size", "patch_size_t"):
        check.require(key, positive_int(c[key]), f"an integer from 1 to {MAX_INT}")
    check.require("patch_size_t", c["patch_size_t"] == 1,
                  "1: upstream's decoder unpatchifies time into frames that its frame rule does not count")
    _check_lists(c, check)
    noise = _per_block(c["decoder_inject_noise"], len(c["decoder_layers_per_block"]))
    check.require("decoder_inject_noise", not any(noise),
                  "false throughout: injected noise is drawn from torch's global generator on every call, "
                  "which a compiled program cannot reproduce")
    for key in ("timestep_conditioning", "encoder_causal", "decoder_causal"):
        check.require(key, isinstance(c[key], bool), "true or false")
    for key in ("encoder_spatial_padding_mode", "decoder_spatial_padding_mode"):
        check.require(key, c[key] in PADDING_MODES, f"one of {', '.join(map(repr, PADDING_MODES))}")
    check.require("resnet_norm_eps", finite(c["resnet_norm_eps"]) and c["resnet_norm_eps"] > 0, "a positive number")
    check.require("scaling_factor", finite(c["scaling_factor"]) and c["scaling_factor"] > 0,
                  "a positive number (the pipeline divides latents by it)")
    _check_encoder_channels(c, check)
    _check_decoder_channels(c, check)
    space, time = spatial_scale(c), temporal_scale(c)
    check.require("spatial_compression_ratio", _encoder_scales(c)[0] == space,
                  f"an encoder that compresses space as the decoder expands it ({space}x); check downsample_type")
    check.require("temporal_compression_ratio", _encoder_scales(c)[1] == time,
                  f"an encoder that compresses time as the decoder expands it ({time}x); check downsample_type")
    # Upstream's own default (patch size x 2^(blocks that scale)) is right only when every
    # block scales both space and time; the pipelines size latents by the value it keeps.
    n = len(c["block_out_channels"])
    upstream_space = c["patch_size"] * 2 ** sum(_per_block(c["spatio_temporal_scaling"], n))
    upstream_time = c["patch_size_t"] * 2 ** sum(_per_block(c["spatio_temporal_scaling"], n))
    for key, real, default in (("spatial_compression_ratio", space, upstream_space),
                               ("temporal_compression_ratio", time, upstream_time)):
        value = c[key]
        check.require(key, (value is None and default == real) or (is_int(value) and value == real),
                      f"{real}, the architecture's (left out, upstream would take {default}; its pipelines and "
                      "tiling size latents by it)")
