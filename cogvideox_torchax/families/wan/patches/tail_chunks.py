"""Wan's decoder tail, from the first up block that no longer upsamples in time, run two frames at a time.

Each later latent frame decodes to 4 frames; the last up blocks and the
output head hold them at full resolution (Wan 2.1 at 720p: 675 MiB per
96-channel activation in bf16). From the first up block after the last
time upsampler the frame count no longer changes, and every layer there is
per frame or a causal convolution with its cache: run on 2 frames, then on
the next 2 with the caches the first left, it computes what upstream's
call on 4 frames computes, as upstream's own chunk loop does between calls.
The rest of ``forward`` is upstream's, line for line.

On by default on TPU meshes with ``tp >= 4``, where the per-chip program
shrinks (Wan 2.1 720p x 81: under 2 GiB of temporaries per chip at
``tp=8``, compiled only); elsewhere off unless set: one chip's program
grows, and on GPUs it lowers the compiled memory at a speed no device has
measured (docs/results/wan-tail-chunks-2026-11-28.md).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import CACHE_T, WanDecoder3d

from cogvideox_torchax.patches.base import Patch, add_mixin, is_torchax

TAIL_FRAMES = 2  # frames per piece: CACHE_T, so each piece's cache is its own last frames


def tail_start(decoder: WanDecoder3d) -> int:
    """Index of the first up block after the last one that upsamples in time (0: none does)."""
    ups = [i for i, flag in enumerate(decoder.temperal_upsample[: len(decoder.up_blocks) - 1]) if flag]
    return ups[-1] + 1 if ups else 0


def _cached_conv(conv, x: torch.Tensor, feat_cache: list, feat_idx: list[int]) -> torch.Tensor:
    # Upstream's head and input convolutions with their caches, as its forward writes them.
    idx = feat_idx[0]
    cache_x = x[:, :, -CACHE_T:, :, :].clone()
    if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
        cache_x = torch.cat([feat_cache[idx][:, :, -1, :, :].unsqueeze(2), cache_x], dim=2)
    x = conv(x, feat_cache[idx])
    feat_cache[idx] = cache_x
    feat_idx[0] += 1
    return x


class TailChunkedDecoderMixin:
    """`WanDecoder3d` whose tail (`tail_start` on, and the head) runs `TAIL_FRAMES` frames at a time (torchax only)."""

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False) -> torch.Tensor:  # noqa: B006 (upstream's)
        if feat_cache is None or not is_torchax(x):
            return super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)
        start = tail_start(self)
        x = _cached_conv(self.conv_in, x, feat_cache, feat_idx)
        x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
        for up_block in self.up_blocks[:start]:
            x = up_block(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)
        first_idx, pieces = feat_idx[0], []
        for t in range(0, x.shape[2], TAIL_FRAMES):
            feat_idx[0] = first_idx  # each piece walks the same caches, left by the piece before
            h = x[:, :, t : t + TAIL_FRAMES]
            for up_block in self.up_blocks[start:]:
                h = up_block(h, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)
            h = self.nonlinearity(self.norm_out(h))
            pieces.append(_cached_conv(self.conv_out, h, feat_cache, feat_idx))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


def apply_tail_chunks(vae: torch.nn.Module) -> int:
    """Gives every `WanDecoder3d` in ``vae`` the `TailChunkedDecoderMixin`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return sum(add_mixin(m, TailChunkedDecoderMixin) for m in vae.modules() if isinstance(m, WanDecoder3d))


def _off_by_default(placement: Any) -> str | None:
    # Where the results page measured it: TPU per-chip temporaries fall at tp=4 and 8 and grow at tp=1.
    if placement.platform == "tpu":
        return None if placement.tp >= 4 else "compiled smaller per chip at tp=4 and 8 only (one chip: larger)"
    if placement.platform == "cuda":
        return "compiled smaller for an H200, at a speed no GPU has measured"
    return f"not measured on {placement.platform}"


PATCHES = (
    Patch(
        "wan_tail_chunks", "loops",
        "The decoder's last up blocks (after the last time upsampler) and its output head run on 2 of each latent "
        "frame's 4 frames at a time, the caches carried between the halves as between upstream's calls: the "
        "full-resolution activations are half as large. On by default on TPU with tp >= 4 (compiled memory).",
        lambda m, plan, mesh: apply_tail_chunks(m),
        families=("wan",),
        opt_in=_off_by_default,
    ),
)
