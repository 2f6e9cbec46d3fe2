"""Frame batches decoded by one `jax.lax.scan` instead of an unrolled loop.

Upstream's ``_decode`` walks the latent frames in batches of
``num_latent_frames_batch_size`` (2) in Python, threading the causal conv
cache from batch to batch; the first batch also takes the odd remainder, so
13 frames go 3 + 2 + 2 + 2 + 2 + 2. Traced into one jit, that loop is
unrolled: the decoder is compiled once per batch, and compile time and the
program grow with video length.

Here the first batch runs as upstream (its frame count differs), and every
later batch, all of the same shape, is one step of a `jax.lax.scan` whose
carry is the conv cache. The decoder is traced twice whatever the length,
the per-step computation is exactly upstream's, and so is the result.
"""

from __future__ import annotations

import jax
import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax import patches
from cogvideox_torchax._torch_compat import import_torchax

torchax = import_torchax()


class FrameScanMixin:
    """Overrides ``_decode``: the frame-batch loop as a scan under torchax."""

    def _decode(self, z: torch.Tensor, return_dict: bool = True):
        batch, channels, num_frames, height, width = z.shape
        tiled = self.use_tiling and (width > self.tile_latent_min_width or height > self.tile_latent_min_height)
        per_batch = self.num_latent_frames_batch_size
        num_batches = max(num_frames // per_batch, 1)
        if tiled or num_batches < 2 or not patches.is_torchax(z):
            return super()._decode(z, return_dict=return_dict)

        def step(z_batch, conv_cache):
            if self.post_quant_conv is not None:
                z_batch = self.post_quant_conv(z_batch)
            return self.decoder(z_batch, conv_cache=conv_cache)

        first_len = per_batch + num_frames % per_batch
        first, conv_cache = step(z[:, :, :first_len], None)

        env = torchax.default_env()
        # Finish the first batch before the scan starts, so the tail of the
        # first batch (only its output, not the carry, depends on it) is not
        # scheduled into the loop's lifetime. XLA:CPU deletes barriers unless
        # compiled with patches.KEEP_BARRIERS_COMPILER_OPTIONS (as
        # TorchaxVAE.compile_decode does with cache_first). Measured: 15.6
        # vs 17.0 GiB without it (13 latent frames, 480x720, 2b, fp32,
        # channels-first convs).
        first, conv_cache = env.j2t_iso(jax.lax.optimization_barrier(env.t2j_iso((first, conv_cache))))
        rest = env.t2j_iso(z[:, :, first_len:])  # (B, C, (n-1) * per_batch, H, W)
        xs = rest.reshape(batch, channels, num_batches - 1, per_batch, height, width).transpose(2, 0, 1, 3, 4, 5)

        def body(cache, z_batch):
            z_t, cache_t = env.j2t_iso((z_batch, cache))
            out, new_cache = step(z_t, cache_t)
            return env.t2j_iso(new_cache), env.t2j_iso(out)

        _, outs = jax.lax.scan(body, env.t2j_iso(conv_cache), xs)  # (n-1, B, 3, F, H', W')
        steps, _, out_channels, frames, out_h, out_w = outs.shape
        rest_video = outs.transpose(1, 2, 0, 3, 4, 5).reshape(batch, out_channels, steps * frames, out_h, out_w)
        dec = torch.cat([first, env.j2t_iso(rest_video)], dim=2)
        if not return_dict:
            return (dec,)
        return DecoderOutput(sample=dec)


def apply_frame_scan(vae: AutoencoderKLCogVideoX) -> int:
    """Makes ``vae`` decode its later frame batches with one scan (`FrameScanMixin`).

    Also applies `patches.apply_conv_cache_trim`, without which the first
    batch's cache has a different shape from the later ones' and cannot
    start the scan carry. Composes with `tiling.apply_tile_batching` in
    either order.

    Returns:
        1 if ``vae`` changed in this call, 0 if it already scanned.
    """
    if not isinstance(vae, AutoencoderKLCogVideoX):
        raise TypeError(f"apply_frame_scan expects an AutoencoderKLCogVideoX, got {type(vae).__name__}")
    patches.apply_conv_cache_trim(vae)
    return patches.add_mixin(vae, FrameScanMixin)
