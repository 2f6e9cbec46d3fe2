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

import jax
import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.autoencoders.vae import DecoderOutput

from cogvideox_torchax.patches.base import Patch, add_mixin, is_torchax, torchax
from cogvideox_torchax.patches.causal_conv import apply_conv_cache_trim


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


def scan_frames(
    step, x: torch.Tensor, first_len: int, per_step: int, num_steps: int, *, slice_in_step: bool = False
) -> torch.Tensor:
    """A frame loop over dim 2 of ``x``: a first batch of ``first_len`` frames, then ``num_steps`` scan steps.

    ``step(x_batch, cache) -> (out, cache)`` gets None as the first batch's
    cache; every later step's cache has the shapes the first batch returned.
    Frames past ``first_len + num_steps * per_step`` are not read. Returns
    the outputs joined along dim 2. With ``slice_in_step`` each scan step
    slices its batch out of ``x`` instead of scanning over a batch-major
    copy of the later frames (an encode: a copy of the video, 0.15 GiB for
    49 frames at 480x720 in fp32, alive through the loop). A decode keeps
    the copy (its latents are small).
    """
    batch, channels, _, height, width = x.shape
    first, conv_cache = step(x[:, :, :first_len], None)
    if num_steps < 1:
        return first

    # Only for crossing between torch and JAX views (no op runs through it):
    # the ops run in whichever environment our traced call entered.
    env = torchax.default_env()
    # Finish the first batch before the scan starts, so the tail of the
    # first batch (only its output, not the carry, depends on it) is not
    # scheduled into the loop's lifetime. XLA:CPU deletes barriers unless
    # compiled with patches.KEEP_BARRIERS_COMPILER_OPTIONS (as
    # TorchaxVAE.compile_decode does with cache_first). Measured: 15.6
    # vs 17.0 GiB without it (13 latent frames, 480x720, 2b, fp32,
    # channels-first convs).
    first, conv_cache = env.j2t_iso(jax.lax.optimization_barrier(env.t2j_iso((first, conv_cache))))
    if slice_in_step:
        whole = env.t2j_iso(x)
        xs = jax.numpy.arange(num_steps)

        def batch_of(i):
            return jax.lax.dynamic_slice_in_dim(whole, first_len + i * per_step, per_step, axis=2)

    else:
        rest = env.t2j_iso(x[:, :, first_len : first_len + num_steps * per_step])  # (B, C, steps * per_step, H, W)
        xs = rest.reshape(batch, channels, num_steps, per_step, height, width).transpose(2, 0, 1, 3, 4, 5)

        def batch_of(x_batch):
            return x_batch

    def body(cache, x_step):
        x_t, cache_t = env.j2t_iso((batch_of(x_step), cache))
        out, new_cache = step(x_t, cache_t)
        return env.t2j_iso(new_cache), env.t2j_iso(out)

    _, outs = jax.lax.scan(body, env.t2j_iso(conv_cache), xs)  # (n-1, B, C', F', H', W')
    steps, _, out_channels, frames, out_h, out_w = outs.shape
    rest_out = outs.transpose(1, 2, 0, 3, 4, 5).reshape(batch, out_channels, steps * frames, out_h, out_w)
    return torch.cat([first, env.j2t_iso(rest_out)], dim=2)


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

    Also applies `patches.apply_conv_cache_trim`, without which the first
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
