"""Wan's chunk loops (one latent frame at a time; the first video frame, then 4) as one `jax.lax.scan`.

Upstream's ``_decode`` calls the decoder once per latent frame and
``_encode`` the encoder once per chunk, threading Python lists of caches;
traced into one jit, every call is unrolled and compile time grows with the
video. Here the first chunk runs as upstream, and every later one, all of
the same shape, is one step of a scan whose carry is the caches, made of
one shape by `cogvideox_torchax.families.wan.chunks` (the time upsamplers'
``"Rep"`` written as the two zero frames it stands for,
`RepFreeResampleMixin`). Each step is upstream's computation; so is the
result, for every frame count.
"""

from __future__ import annotations

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan, WanResample
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.families.wan import chunks
from cogvideox_torchax.families.wan.config_check import TEMPORAL_SCALE
from cogvideox_torchax.patches.base import Patch, add_mixin, is_torchax
from cogvideox_torchax.patches.scan import scan_frames


class RepFreeResampleMixin:
    """A time upsampler whose first chunk leaves two zero frames as its cache where upstream leaves ``"Rep"``.

    Upstream's next chunk pads the time convolution with two zero frames
    for ``"Rep"`` and keeps ``[0, x]`` as the cache after it: exactly what a
    cache of two zero frames gives. Only under torchax.
    """

    def forward(self, x: torch.Tensor, feat_cache=None, feat_idx=None) -> torch.Tensor:
        feat_idx = [0] if feat_idx is None else feat_idx
        idx = feat_idx[0]
        first = feat_cache is not None and self.mode == "upsample3d" and feat_cache[idx] is None and is_torchax(x)
        out = super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx)
        if first:
            b, c, _, h, w = x.shape
            feat_cache[idx] = x.new_zeros((b, c, chunks.CACHE_T, h, w))
        return out


class WanFrameScanMixin:
    """Overrides ``_decode`` and ``_encode``: the chunk loops as scans under torchax (tiled calls as upstream)."""

    def _decode(self, z: torch.Tensor, return_dict: bool = True):
        _, _, _, height, width = z.shape
        ratio = self.spatial_compression_ratio
        tiled = self.use_tiling and (width > self.tile_sample_min_width // ratio
                                     or height > self.tile_sample_min_height // ratio)
        if tiled or not is_torchax(z):
            return super()._decode(z, return_dict=return_dict)
        dec = self.decode_frames(z, finish=True)
        return DecoderOutput(sample=dec) if return_dict else (dec,)

    def decode_frames(self, z: torch.Tensor, *, finish: bool) -> torch.Tensor:
        """Every latent frame of ``z`` through the decoder, the frames after the first as one scan.

        ``finish``: each chunk unpatchified and clamped as upstream's
        ``_decode`` returns it (`chunks.finish`); False leaves the decoder's
        output, as upstream's tiled decode blends it.
        """

        return scan_frames(self.frame_step(finish=finish), z, 1, 1, z.shape[2] - 1)

    def frame_step(self, *, finish: bool):
        """``(z_frame, cache) -> (frames, cache)``: one latent frame through the decoder (None: the first's cache)."""

        def step(z_frame, cache):
            out, cache = chunks.decode_chunk(self, z_frame, cache)
            return (chunks.finish(self, out) if finish else out), cache

        return step

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        _, _, num_frames, height, width = x.shape
        tiled = self.use_tiling and (width > self.tile_sample_min_width or height > self.tile_sample_min_height)
        if tiled or not is_torchax(x):
            return super()._encode(x)
        if self.config.patch_size is not None:
            x = chunks.patchify(x, patch_size=self.config.patch_size)

        def step(x_chunk, cache):
            return chunks.encode_chunk(self, x_chunk, cache)

        steps = (num_frames - 1) // TEMPORAL_SCALE
        out = scan_frames(step, x, 1, TEMPORAL_SCALE, steps, slice_in_step=True)
        return self.quant_conv(out)


def apply_frame_scan(vae: AutoencoderKLWan) -> int:
    """Makes ``vae`` decode and encode its later chunks with one scan (`WanFrameScanMixin`).

    Also gives every `WanResample` the `RepFreeResampleMixin`, without which
    the first chunk's caches differ from the later ones'.

    Returns:
        1 if ``vae`` changed in this call, 0 if it already scanned.
    """
    if not issubclass(type(vae), AutoencoderKLWan):  # not a TorchaxVAE, which passes isinstance
        raise TypeError(f"apply_frame_scan expects an AutoencoderKLWan, got {type(vae).__name__}")
    for module in vae.modules():
        if isinstance(module, WanResample):
            add_mixin(module, RepFreeResampleMixin)
    return add_mixin(vae, WanFrameScanMixin)


PATCHES = (
    Patch(
        "wan_frame_scan", "loops",
        "Decode the latent frames after the first, and encode the 4-frame chunks after the first frame, with one "
        "`jax.lax.scan` carrying upstream's caches at one shape (compile time independent of length); False "
        "keeps upstream's loops, unrolled into the jit.",
        lambda m, plan, mesh: apply_frame_scan(m),
        families=("wan",),
    ),
)
