"""Frame batches decoded and encoded by one `jax.lax.scan` instead of an unrolled loop.

Upstream's ``_decode`` walks the latent frames in batches of
``num_latent_frames_batch_size`` (2) in Python, threading the causal conv
cache from batch to batch; the first batch also takes the odd remainder, so
13 frames go 3 + 2 + 2 + 2 + 2 + 2. ``_encode`` does the same with video
frames in batches of ``num_sample_frames_batch_size`` (8): 49 frames go
9 + 8 x 5. Traced into one jit, such a loop is unrolled: the decoder (or
encoder) is compiled once per batch, and compile time, the program and its
memory grow with video length.

Here the first batch runs as upstream (its frame count differs), and every
later batch, all of the same shape, is one step of a `jax.lax.scan` whose
carry is the conv cache. The network is traced twice whatever the length,
the per-step computation is exactly upstream's, and so is the result.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.families.cogvideox.patches.causal_conv import apply_conv_cache_trim
from cogvideox_torchax.patches.base import Patch, add_mixin, is_torchax
from cogvideox_torchax.patches.scan import scan_frames


def _scan_batches(
    step, x: torch.Tensor, per_batch: int, num_batches: int, *, slice_in_step: bool = False
) -> torch.Tensor:
    """Upstream's frame-batch loop over dim 2 of ``x``, the batches after the first as one scan.

    ``step(x_batch, conv_cache) -> (out, conv_cache)``; the first batch takes
    ``per_batch`` plus the remainder. Returns the outputs joined along dim 2
    (`scan_frames`).
    """
    first_len = per_batch + x.shape[2] % per_batch
    return scan_frames(step, x, first_len, per_batch, num_batches - 1, slice_in_step=slice_in_step)


class FrameScanMixin:
    """Overrides ``_decode`` and ``_encode``: the frame-batch loops as scans under torchax."""

    def _decode(self, z: torch.Tensor, return_dict: bool = True):
        _, _, num_frames, height, width = z.shape
        tiled = self.use_tiling and (width > self.tile_latent_min_width or height > self.tile_latent_min_height)
        per_batch = self.num_latent_frames_batch_size
        num_batches = max(num_frames // per_batch, 1)
        if tiled or num_batches < 2 or not is_torchax(z):
            return super()._decode(z, return_dict=return_dict)

        def step(z_batch, conv_cache):
            if self.post_quant_conv is not None:
                z_batch = self.post_quant_conv(z_batch)
            return self.decoder(z_batch, conv_cache=conv_cache)

        dec = _scan_batches(step, z, per_batch, num_batches)
        if not return_dict:
            return (dec,)
        return DecoderOutput(sample=dec)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        _, _, num_frames, height, width = x.shape
        tiled = self.use_tiling and (width > self.tile_sample_min_width or height > self.tile_sample_min_height)
        per_batch = self.num_sample_frames_batch_size
        num_batches = max(num_frames // per_batch, 1)
        if tiled or num_batches < 2 or not is_torchax(x):
            return super()._encode(x)

        def step(x_batch, conv_cache):
            enc, conv_cache = self.encoder(x_batch, conv_cache=conv_cache)
            if self.quant_conv is not None:
                enc = self.quant_conv(enc)
            return enc, conv_cache

        return _scan_batches(step, x, per_batch, num_batches, slice_in_step=True)


def apply_frame_scan(vae: AutoencoderKLCogVideoX) -> int:
    """Makes ``vae`` decode and encode its later frame batches with one scan (`FrameScanMixin`).

    Also applies `causal_conv.apply_conv_cache_trim`, without which the first
    batch's cache has a different shape from the later ones' and cannot
    start the scan carry. Composes with `tiling.apply_tile_batching` in
    either order.

    Returns:
        1 if ``vae`` changed in this call, 0 if it already scanned.
    """
    if not issubclass(type(vae), AutoencoderKLCogVideoX):  # not a TorchaxVAE, which passes isinstance
        raise TypeError(f"apply_frame_scan expects an AutoencoderKLCogVideoX, got {type(vae).__name__}")
    apply_conv_cache_trim(vae)
    return add_mixin(vae, FrameScanMixin)


PATCHES = (
    Patch(
        "frame_scan", "loops",
        "Decode and encode the frame batches after the first with one `jax.lax.scan` (compile time independent "
        "of length); False keeps upstream's loops, unrolled into the jit.",
        lambda m, plan, mesh: apply_frame_scan(m),
        families=("cogvideox",),
        requires=("trim_conv_cache",),
    ),
)
