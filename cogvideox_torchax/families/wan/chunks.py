"""Upstream Wan's decode and encode loops, one chunk at a time, with caches of one shape from the second chunk on.

Upstream's ``_decode`` runs the decoder on one latent frame at a time and
``_encode`` the encoder on the first video frame, then 4 at a time, each
call threading a Python list of feature caches (``feat_cache``). After the
first chunk that list holds, per causal convolution, its input's last
frames: one frame where the first chunk had one, two later; and for each
time-upsampling resampler the string ``"Rep"``, which makes the next chunk
pad with zeros. Here every cache is front-padded with zero frames to
``CACHE_T`` (2), the padding the causal convolution would add itself, and
the resampler's ``"Rep"`` is two zero frames (the frame-scan patch writes
them, `cogvideox_torchax.families.wan.patches.frame_scan`): the same values,
and a cache whose shapes the chunks after the first all share, so they run
as one `jax.lax.scan` step or one streamed program.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import CACHE_T, patchify, unpatchify

__all__ = ["CACHE_T", "decode_chunk", "encode_chunk", "finish", "patchify", "steady"]


def steady(feat_cache: list[Any]) -> list[Any]:
    """The caches a chunk left, each tensor front-padded with zero frames to ``CACHE_T``.

    A causal convolution reads its cache joined before its input and pads
    the missing frames with zeros; a downsampler reads only the last frame.
    """
    out = []
    for c in feat_cache:
        if isinstance(c, torch.Tensor) and c.shape[2] < CACHE_T:
            c = torch.cat([c.new_zeros((*c.shape[:2], CACHE_T - c.shape[2], *c.shape[3:])), c], dim=2)
        out.append(c)
    return out


def decode_chunk(module: Any, z: torch.Tensor, cache: list[Any] | None) -> tuple[torch.Tensor, list[Any]]:
    """One latent frame ``(B, C, 1, H, W)`` through ``post_quant_conv`` and the decoder, as upstream's loop runs it.

    ``cache`` None is the first chunk (upstream's ``first_chunk=True``).
    Returns the chunk's decoder output, before `finish`, and the caches for
    the next chunk (`steady`).
    """
    first = cache is None
    feat = [None] * module._cached_conv_counts["decoder"] if first else list(cache)
    x = module.post_quant_conv(z)
    kwargs = {"first_chunk": True} if first else {}
    out = module.decoder(x, feat_cache=feat, feat_idx=[0], **kwargs)
    return out, steady(feat)


def finish(module: Any, out: torch.Tensor) -> torch.Tensor:
    """The decoder's output as upstream's ``_decode`` returns it: unpatchified and clamped to [-1, 1]."""
    if module.config.patch_size is not None:
        out = unpatchify(out, patch_size=module.config.patch_size)
    return torch.clamp(out, min=-1.0, max=1.0)


def encode_chunk(module: Any, x: torch.Tensor, cache: list[Any] | None) -> tuple[torch.Tensor, list[Any]]:
    """One chunk of the patchified video (the first frame, or 4 later ones) through the encoder.

    Returns the chunk's encoder output (before ``quant_conv``, which
    upstream runs on the joined chunks) and the caches for the next chunk.
    """
    feat = [None] * module._cached_conv_counts["encoder"] if cache is None else list(cache)
    out = module.encoder(x, feat_cache=feat, feat_idx=[0])
    return out, steady(feat)
