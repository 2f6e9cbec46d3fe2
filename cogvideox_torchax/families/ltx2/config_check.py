"""The checks of an LTX VAE config (`AutoencoderKLLTX2Video`, `AutoencoderKLLTXVideo`) and the geometry it implies.

No stricter than upstream: a config upstream's constructor builds is taken,
and whatever upstream then trips over (a channel count a layer cannot take,
a list too short for the blocks it describes) is refused where upstream
refuses it, when it is built or when it runs (`vae.as_upstream`). Refused
here besides: a temporal patch size other than 1 (frames this package's
frame rules do not count) and values the pipelines divide by. Compression
ratios that disagree with the architecture are upstream's quirk, kept: one
warning says what upstream will size latents and tiles by. The geometry
follows upstream's constructors index for index; the two classes differ in
their down blocks (LTX-Video's first kind always halves time and space) and
up blocks (LTX-Video's always double both), and LTX-2 alone has padding
modes. Every function takes the upstream class's name (``kind``), LTX-2's
by default.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Mapping
from typing import Any

from cogvideox_torchax.families.checks import MAX_INT, Checker, check_builds, finite, positive_int

# Upstream's block kinds and the strides (time, height, width) each scales by.
DOWNSAMPLE_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2), "conv": (2, 2, 2)}
UPSAMPLE_STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


LTX2 = "AutoencoderKLLTX2Video"
LTX_VIDEO = "AutoencoderKLLTXVideo"
# LTX-Video's down block kinds: the first always scales by 2 in time and space, the second by its downsample_type.
_LTX_VIDEO_BLOCK, _LTX_VIDEO_095_BLOCK = "LTXVideoDownBlock3D", "LTXVideo095DownBlock3D"


@functools.cache
def defaults(kind: str = LTX2) -> dict[str, Any]:
    """Upstream's defaults for the keys a config may leave out."""
    import diffusers

    params = inspect.signature(getattr(diffusers, kind).__init__).parameters
    return {k: v.default for k, v in params.items() if k != "self"}


def merged(config: Mapping[str, Any], kind: str = LTX2) -> dict[str, Any]:
    """``config`` over upstream's defaults."""
    return {**defaults(kind), **config}


def _per_block(value: Any, count: int) -> list[Any]:
    # Upstream widens a lone bool to one per block.
    return [value] * count if isinstance(value, bool) else list(value)


def encoder_blocks(config: Mapping[str, Any], kind: str = LTX2) -> list[tuple[bool, str]]:
    """The encoder's down blocks in the order they run, as its constructor reads them: ``(scales, downsample_type)``.

    An LTX-Video block of the first kind reads as ``"conv"`` (it halves time and space whatever its type says).
    """
    c = merged(config, kind)
    if kind == LTX2:
        scaling = _per_block(c["spatio_temporal_scaling"], len(c["layers_per_block"]) - 1)
        return [(bool(scaling[i]), c["downsample_type"][i]) for i in range(len(c["block_out_channels"]))]
    types = list(c["down_block_types"])
    count = len(c["block_out_channels"]) - (1 if types[-1] == _LTX_VIDEO_095_BLOCK else 0)
    return [(bool(c["spatio_temporal_scaling"][i]),
             c["downsample_type"][i] if types[i] == _LTX_VIDEO_095_BLOCK else "conv") for i in range(count)]


def decoder_blocks(config: Mapping[str, Any], kind: str = LTX2) -> list[tuple[bool, str, int, bool]]:
    """The decoder's up blocks in the order they run: ``(scales, upsample_type, upsample_factor, residual)``.

    As upstream's constructor reads them: its per-block lists reversed, but
    LTX-2's ``upsample_type`` read in its own order, one block per
    ``decoder_block_out_channels`` entry. LTX-Video's up blocks all scale
    time and space (``"spatiotemporal"``).
    """
    c = merged(config, kind)
    n = len(c["decoder_layers_per_block"]) - 1
    scaling = list(reversed(_per_block(c["decoder_spatio_temporal_scaling"], n)))
    residual = list(reversed(_per_block(c["upsample_residual"], n)))
    factors = list(reversed(list(c["upsample_factor"])))
    count = len(c["decoder_block_out_channels"])
    types = list(c["upsample_type"]) if kind == LTX2 else ["spatiotemporal"] * count
    return [(bool(scaling[i]), types[i], int(factors[i]), bool(residual[i])) for i in range(count)]


def spatial_scale(config: Mapping[str, Any], kind: str = LTX2) -> int:
    """Video pixels per latent pixel: the patch size times each spatial doubling of the decoder."""
    c = merged(config, kind)
    ups = [UPSAMPLE_STRIDES[t][1] for scales, t, _, _ in decoder_blocks(c, kind) if scales]
    return int(c["patch_size"]) * math.prod(ups)


def temporal_scale(config: Mapping[str, Any], kind: str = LTX2) -> int:
    """Video frames per latent frame after the first: each temporal doubling of the decoder (first frame kept)."""
    c = merged(config, kind)
    ups = [UPSAMPLE_STRIDES[t][0] for scales, t, _, _ in decoder_blocks(c, kind) if scales]
    return int(c["patch_size_t"]) * math.prod(ups)


def encoder_scales(config: Mapping[str, Any], kind: str = LTX2) -> tuple[int, int]:
    """What the encoder compresses: ``(pixels, frames after the first)`` per latent pixel and frame."""
    c = merged(config, kind)
    # A kind upstream's down block does not know builds no downsampler there (it runs, unscaled).
    strides = [DOWNSAMPLE_STRIDES.get(t, (1, 1, 1)) for scales, t in encoder_blocks(c, kind) if scales]
    return (int(c["patch_size"]) * math.prod(s[1] for s in strides),
            int(c["patch_size_t"]) * math.prod(s[0] for s in strides))


def ratio_warnings(config: Mapping[str, Any], kind: str = LTX2) -> list[str]:
    """What a config's compression ratios say against its architecture, and what upstream does with them."""
    c = merged(config, kind)
    (space_in, time_in), space, time = encoder_scales(c, kind), spatial_scale(c, kind), temporal_scale(c, kind)
    n = len(c["layers_per_block"]) - 1
    counted = sum(_per_block(c["spatio_temporal_scaling"], n))
    notes = []
    for key, real, default in (("spatial_compression_ratio", space_in, c["patch_size"] * 2**counted),
                               ("temporal_compression_ratio", time_in, c["patch_size_t"] * 2**counted)):
        taken = default if c[key] is None else c[key]
        if taken != real:
            how = "left out, upstream takes" if c[key] is None else "upstream takes"
            notes.append(f"{key}: {how} {taken} where the encoder compresses {real}x; upstream's tiling and its "
                         f"pipelines size latents by {taken}, and so does this VAE (upstream's attribute, kept)")
    if (space_in, time_in) != (space, time):
        notes.append(f"the encoder compresses {space_in}x in space and {time_in}x in time, the decoder expands "
                     f"{space}x and {time}x: decoded videos are not the size encoded, as upstream's are not")
    return notes


def check_config(config: Mapping[str, Any], source: str = "config", kind: str = LTX2) -> None:
    """Refuses what upstream's constructor refuses, and what would not run as upstream runs it.

    Keys left out take upstream's defaults. A config whose compression
    ratios disagree with its architecture is taken (upstream's quirk), with
    one warning per disagreement (`ratio_warnings`).

    Raises:
        ConfigError: naming the key, its value and what it must be, or what
            upstream's constructor raised.
    """
    c = merged(config, kind)
    check = Checker(c, source)
    for key in ("in_channels", "out_channels", "latent_channels", "patch_size", "patch_size_t"):
        check.require(key, positive_int(c[key]), f"an integer from 1 to {MAX_INT}")
    check.require("patch_size_t", c["patch_size_t"] == 1,
                  "1: upstream's decoder unpatchifies time into frames that this package's frame rules do not count")
    for key in ("timestep_conditioning", "encoder_causal", "decoder_causal"):
        check.require(key, isinstance(c[key], bool), "true or false")
    for key in ("encoder_spatial_padding_mode", "decoder_spatial_padding_mode"):
        if key in c:
            check.require(key, c[key] in PADDING_MODES, f"one of {', '.join(map(repr, PADDING_MODES))}")
    check.require("scaling_factor", finite(c["scaling_factor"]) and c["scaling_factor"] > 0,
                  "a positive number (the pipeline divides latents by it)")
    for key in ("spatial_compression_ratio", "temporal_compression_ratio"):
        check.require(key, c[key] is None or positive_int(c[key]),
                      "null or a positive integer (upstream's tiling divides sizes by it)")
    import diffusers

    check_builds(getattr(diffusers, kind), c, source)
    for note in ratio_warnings(c, kind):
        warnings.warn(f"{kind} config: {note}", UserWarning, stacklevel=2)  # once, whichever file
