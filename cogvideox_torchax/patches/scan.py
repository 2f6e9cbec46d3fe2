"""A frame loop as a first batch and one `jax.lax.scan` over the rest: every family's frame scan.

Upstream's encoders and decoders walk frames in Python, threading causal
convolution caches from one batch to the next; traced into one jit, such a
loop is unrolled and the program grows with the video's length. A family's
frame-scan patch gives `scan_frames` one step of its loop (the first batch
runs alone, as its frame count or its caches differ) and gets the same
outputs from a program that holds the step twice whatever the length.
"""

from __future__ import annotations

import jax
import torch

from cogvideox_torchax.patches.base import torchax


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
