"""Wan's residual blocks run their causal convolutions on a few output frames at a time.

Upstream's `WanResidualBlock` norms and activates its whole input, joins
the conv cache in front, pads, and convolves: at 720p the last up block's
4 frames of 96 channels are 675 MiB each in bf16, and the padded input
of 6 frames 1012 MiB, all alive at once beside the carried caches. Wan's
RMS norm is per pixel (over channels), so any frames of ``silu(norm(x))``
are those frames of the whole: here each convolution reads a window of
``k + 2`` frames (the cache or zeros, then the block's frames) built from
``x`` when it is needed, one window after another (an optimization
barrier orders them), and returns ``k`` frames; the cache written for the
next latent frame is upstream's. The arithmetic of every output frame is
upstream's, so are the values.

Which blocks: those whose padded convolution input would hold more than
`WHOLE_ELEMENTS` per device (`chunk_frames`); the figures are in
docs/design.md ("Wan's accelerator programs").
"""

from __future__ import annotations

import math

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import CACHE_T, WanResidualBlock

from cogvideox_torchax.patches.base import Patch, barrier, is_torchax, swap_classes

# A block whose padded convolution input holds at most this many elements
# per device runs whole; above it, chunks of output frames whose windows
# (k + 2 padded frames) hold at most CHUNK_ELEMENTS.
WHOLE_ELEMENTS = 2**28
CHUNK_ELEMENTS = 2**28


def chunk_frames(shape: tuple[int, ...], conv: torch.nn.Conv3d, devices: int = 1) -> int | None:
    """Output frames per chunk for a causal conv of input ``shape`` ``(B, C, T, H, W)``; None runs it whole.

    ``devices``: how many devices share each activation (its width over ``tp``).
    """
    b, c, t, h, w = shape
    kt, kh, kw = conv.kernel_size
    frame = b * max(c, conv.out_channels) * (h + kh - 1) * (w + kw - 1) / devices
    if t < 2 or (t + kt - 1) * frame <= WHOLE_ELEMENTS:
        return None
    return max(1, min(t - 1, math.floor(CHUNK_ELEMENTS / frame) - (kt - 1)))


class TimeChunkedWanResidualBlock(WanResidualBlock):
    """`WanResidualBlock` whose causal convolutions run on chunks of output frames (torchax, cached calls only).

    ``devices``: how many devices share an activation (set by
    `apply_time_chunks`); `chunk_frames` reads it.
    """

    devices: int = 1

    def forward(self, x, feat_cache=None, feat_idx=[0]) -> torch.Tensor:  # noqa: B006 (upstream's signature)
        k = chunk_frames(tuple(x.shape), self.conv1, self.devices)
        if feat_cache is None or k is None or not is_torchax(x):
            return super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx)
        h = self.conv_shortcut(x)
        x = self._chunked(self.conv1, x, lambda v: self.nonlinearity(self.norm1(v)), feat_cache, feat_idx, k)
        x = self._chunked(self.conv2, x, lambda v: self.dropout(self.nonlinearity(self.norm2(v))), feat_cache,
                          feat_idx, k)
        return x + h

    @staticmethod
    def _chunked(conv, x: torch.Tensor, act, feat_cache: list, feat_idx: list, k: int) -> torch.Tensor:
        """``conv(act(x), feat_cache[idx])`` as upstream's block runs it, ``k`` output frames at a time."""
        idx = feat_idx[0]
        old = feat_cache[idx]
        # The sequence upstream convolves: zero frames, the old cache, act(x) (2 frames before x's).
        front = CACHE_T - (0 if old is None else old.shape[2])
        t = x.shape[2]
        outs = []
        for j0 in range(0, t, k):
            j1 = min(j0 + k, t)
            if outs:  # this window is built after the last chunk's convolution
                x, _ = barrier((x, outs[-1]))
            parts = []
            for s in range(j0, min(j1 + CACHE_T, CACHE_T)):  # the frames before x's
                if s < front:
                    parts.append(torch.zeros_like(x[:, :, :1]))
                else:
                    parts.append(old[:, :, s - front : s - front + 1])
            parts.append(act(x[:, :, max(j0 - CACHE_T, 0) : j1]))
            window = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
            outs.append(conv(window[:, :, CACHE_T:], window[:, :, :CACHE_T]))
        # The next cache, as upstream takes it (act of the last frames, after the old cache's last frame if
        # only one), taken after the last window was read so that it can replace the old one in place.
        x, _ = barrier((x, outs[-1]))
        cache_x = act(x[:, :, -CACHE_T:])
        if cache_x.shape[2] < 2 and old is not None:
            cache_x = torch.cat([old[:, :, -1:], cache_x], dim=2)
        feat_cache[idx] = cache_x
        feat_idx[0] += 1
        return torch.cat(outs, dim=2)


def apply_time_chunks(vae: torch.nn.Module, devices: int = 1) -> int:
    """Makes every `WanResidualBlock` in ``vae`` a `TimeChunkedWanResidualBlock` (``devices`` share an activation).

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = swap_classes(vae, {WanResidualBlock: TimeChunkedWanResidualBlock})
    for module in vae.modules():
        if isinstance(module, TimeChunkedWanResidualBlock):
            module.devices = devices
    return count


PATCHES = (
    Patch(
        "wan_time_chunks", "blocks",
        "`WanResidualBlock` runs each causal convolution on a few output frames at a time, each window of input "
        "frames normed, activated and joined to the cache when it is read, where the whole padded input would hold "
        "more than 2^28 elements per device (Wan 2.1's last up block at 720p); upstream's values.",
        lambda m, plan, mesh: apply_time_chunks(m, plan.placement.tp),
        families=("wan",),
    ),
)
