"""HunyuanVideo's frame windows with upstream's blending, equal windows one `jax.lax.scan`: a program flat in length.

Upstream decodes more than ``tile_sample_min_num_frames // 4`` latent frames
(4 by default) in windows (``use_framewise_decoding``, on by default): one
window of 5 latent frames every 3, each through the whole decoder, each
after the first losing its first frame and fading in from its predecessor
over 4 video frames; its encode does the same with 17 video frames every 12.
Traced into one jit that is one decoder per window: the program grows with
the video. Here the windows, the blending and the crop are upstream's, but
windows of one length (all but at most two at the end) are stacked on the
batch and decoded ``windows_per_step`` at a time as the steps of one scan
(`patches.tiling.decode_tile_group`): the program holds one decoder per
window length, whatever the length of the video, and memory does not grow
with the number of windows (on XLA:CPU, once the full windows are a scan,
about two windows' worth: docs/families/hunyuan.md).
"""

from __future__ import annotations

import functools

import torch
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import AutoencoderKLHunyuanVideo
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.patches.base import Patch, interop, is_torchax
from cogvideox_torchax.patches.tiling import add_batching, blend, decode_tile_group


def windowed(x: torch.Tensor, size: int, stride: int, code, extent: int, keep: int, total: int,
             windows_per_step: int) -> torch.Tensor:
    """Upstream's frame windows over dim 2 of ``x``, coded by length group, blended and joined.

    Windows of ``size`` frames start every ``stride`` frames (cut short at
    the end); ``code`` maps a batch of windows to their outputs; each output
    after the first drops its first frame and fades in from the previous
    (already blended) one over ``extent`` frames (`patches.tiling.blend`);
    the first keeps ``keep + 1`` frames, the others ``keep``; the joined
    result is cut to ``total`` frames.
    """
    batch, frames = x.shape[0], x.shape[2]
    starts = list(range(0, frames, stride))
    groups: dict[int, list[int]] = {}
    for i in starts:
        groups.setdefault(min(size, frames - i), []).append(i)
    coded: dict[int, torch.Tensor] = {}
    for length, where in groups.items():
        stacked = torch.cat([x[:, :, i : i + length] for i in where], dim=0)
        out = decode_tile_group(code, stacked, len(where), windows_per_step)
        for n, i in enumerate(where):
            coded[i] = out[n * batch : (n + 1) * batch]

    fade = interop.torch_view(functools.partial(blend, extent=extent, axis=2))
    kept, previous = [], None
    # Upstream blends in place: each window fades in from its already-blended predecessor.
    for n, i in enumerate(starts):
        window = coded[i]
        if n == 0:
            kept.append(window[:, :, : keep + 1])
        else:
            window = fade(previous, window[:, :, 1:])
            kept.append(window[:, :, :keep])
        previous = window
    return torch.cat(kept, dim=2)[:, :, :total]


class HunyuanFrameWindowsMixin:
    """Overrides ``_temporal_tiled_decode`` and ``_temporal_tiled_encode``: upstream's windows, one scan per length."""

    windows_per_step: int = 1

    def _temporal_tiled_decode(self, z: torch.Tensor, return_dict: bool = True):
        if not is_torchax(z):
            return super()._temporal_tiled_decode(z, return_dict=return_dict)
        ratio, t_ratio = self.spatial_compression_ratio, self.temporal_compression_ratio
        tile_h, tile_w = self.tile_sample_min_height // ratio, self.tile_sample_min_width // ratio

        def decode(tile: torch.Tensor) -> torch.Tensor:
            if self.use_tiling and (tile.shape[-1] > tile_w or tile.shape[-2] > tile_h):
                return self.tiled_decode(tile, return_dict=True).sample
            return self.decoder(self.post_quant_conv(tile))

        dec = windowed(z, self.tile_sample_min_num_frames // t_ratio + 1, self.tile_sample_stride_num_frames // t_ratio,
                       decode, self.tile_sample_min_num_frames - self.tile_sample_stride_num_frames,
                       self.tile_sample_stride_num_frames, (z.shape[2] - 1) * t_ratio + 1, self.windows_per_step)
        return DecoderOutput(sample=dec) if return_dict else (dec,)

    def _temporal_tiled_encode(self, x: torch.Tensor):
        if not is_torchax(x):
            return super()._temporal_tiled_encode(x)
        t_ratio = self.temporal_compression_ratio
        height, width = x.shape[-2:]

        def encode(tile: torch.Tensor) -> torch.Tensor:
            if self.use_tiling and (height > self.tile_sample_min_height or width > self.tile_sample_min_width):
                return self.tiled_encode(tile)
            return self.quant_conv(self.encoder(tile))

        latent_min = self.tile_sample_min_num_frames // t_ratio
        latent_stride = self.tile_sample_stride_num_frames // t_ratio
        return windowed(x, self.tile_sample_min_num_frames + 1, self.tile_sample_stride_num_frames, encode,
                        latent_min - latent_stride, latent_stride, (x.shape[2] - 1) // t_ratio + 1,
                        self.windows_per_step)


def apply_frame_windows(vae: AutoencoderKLHunyuanVideo, windows_per_step: int = 1) -> int:
    """Makes ``vae``'s windowed decode and encode scan over equal windows.

    The windows stay upstream's switches (``use_framewise_decoding``,
    ``use_framewise_encoding``, ``tile_sample_*_num_frames``).

    Returns:
        1 if ``vae``'s class changed in this call, else 0 (``windows_per_step`` is updated either way).
    """
    if not issubclass(type(vae), AutoencoderKLHunyuanVideo):  # not a TorchaxVAE, which passes isinstance
        raise TypeError(f"apply_frame_windows expects an AutoencoderKLHunyuanVideo, got {type(vae).__name__}")
    return add_batching(vae, HunyuanFrameWindowsMixin, "windows_per_step", windows_per_step)


PATCHES = (
    Patch(
        "hunyuan_frame_windows", "loops",
        "Upstream's frame windows (``use_framewise_decoding`` / ``_encoding``, on by default) with its blending, "
        "windows of one length stacked and decoded one per ``dp`` replica per scan step: the program holds one "
        "decoder per window length whatever the video's length; False traces upstream's loop, one decoder per window.",
        lambda m, plan, mesh: apply_frame_windows(m, windows_per_step=plan.placement.dp),
        families=("hunyuan",),
    ),
)
