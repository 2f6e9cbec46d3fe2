"""The scanned decode writes each step's frames into the video it returns, carried by the scan.

`wan_frame_scan` stacks the scan steps' outputs (``(T - 1, B, C, 4, H, W)``),
then moves them behind the first frame: a stacked copy of the whole video
beside the video itself. Here the video ``(B, C, 1 + 4 (T - 1), H, W)``
is part of the scan's carry from the start (the first frame written in),
and each step writes its 4 frames in place (``dynamic_update_slice``): the
same values, one video's worth less memory (Wan 2.1 at 720p x 81, bf16:
0.41 GiB of stacked frames).
"""

from __future__ import annotations

import jax
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

from cogvideox_torchax.families.wan.config_check import TEMPORAL_SCALE, temporal_scale
from cogvideox_torchax.patches.base import Patch, add_mixin, torchax


def decode_into_video(step, z: torch.Tensor, per_frame: int = TEMPORAL_SCALE) -> torch.Tensor:
    """Upstream's per-latent-frame loop over ``z`` ``(B, C, T, H, W)``, the frames after the first as one scan.

    ``step(z_frame, cache) -> (frames, cache)`` gets None as the first
    frame's cache and gives ``per_frame`` frames for each later latent frame
    (`config_check.temporal_scale`: 4 for every released Wan). The video is
    allocated once, the first frame's output written in, and each scan step
    writes its frames after it.
    """
    env = torchax.default_env()
    num_frames = z.shape[2]
    first, cache = step(z[:, :, :1], None)
    _check_frames(first.shape[2], 1, "the first latent frame")
    if num_frames < 2:
        return first
    first_j, cache_j = env.t2j_iso((first, cache))
    # As in `patches.scan.scan_frames`: the first frame finished before the loop starts.
    first_j, cache_j = jax.lax.optimization_barrier((first_j, cache_j))
    b, c, _, h, w = first_j.shape
    total = 1 + per_frame * (num_frames - 1)
    video = jax.lax.dynamic_update_slice_in_dim(
        jax.numpy.zeros((b, c, total, h, w), first_j.dtype), first_j, 0, axis=2)
    latents = env.t2j_iso(z)

    def body(i, carry):
        video, cache = carry
        z_t = jax.lax.dynamic_slice_in_dim(latents, i, 1, axis=2)
        out, new_cache = step(*env.j2t_iso((z_t, cache)))
        out = env.t2j_iso(out)
        _check_frames(out.shape[2], per_frame, "each later latent frame")
        video = jax.lax.dynamic_update_slice_in_dim(video, out, 1 + (i - 1) * per_frame, axis=2)
        return video, env.t2j_iso(new_cache)

    video, _ = jax.lax.fori_loop(1, num_frames, body, (video, cache_j))
    return env.j2t_iso(video)


def _check_frames(got: int, expected: int, what: str) -> None:
    # The video's length is fixed before the loop; a step of another length would leave frames unwritten.
    if got != expected:
        raise ValueError(f"the decoder gave {got} frames for {what}, the video carry expects {expected}")


class VideoCarryMixin:
    """Overrides `WanFrameScanMixin.decode_frames` (whole and tiled decodes): one loop carrying the video."""

    def decode_frames(self, z: torch.Tensor, *, finish: bool) -> torch.Tensor:
        return decode_into_video(self.frame_step(finish=finish), z, temporal_scale(self.config))


def apply_video_carry(vae: AutoencoderKLWan) -> int:
    """Makes ``vae``'s scanned decode carry its video (`VideoCarryMixin`); after `wan_frame_scan`.

    Returns:
        1 if ``vae`` changed in this call, 0 if it already did.

    Raises:
        TypeError: ``vae`` is not an `AutoencoderKLWan`.
        ValueError: the frame scan is not applied yet.
    """
    if not issubclass(type(vae), AutoencoderKLWan):
        raise TypeError(f"apply_video_carry expects an AutoencoderKLWan, got {type(vae).__name__}")
    if not hasattr(vae, "frame_step"):
        raise ValueError("apply_video_carry needs the frame scan first (apply_frame_scan): it replaces its loop")
    return add_mixin(vae, VideoCarryMixin)


PATCHES = (
    Patch(
        "wan_video_carry", "loops",
        "The scanned decode carries the whole video and writes each latent frame's frames into it in place, "
        "instead of stacking the steps' outputs and joining them after the loop (one video's worth less memory).",
        lambda m, plan, mesh: apply_video_carry(m),
        families=("wan",),
        platforms=("cuda", "tpu"),
        platforms_why="measured on CUDA and TPU only (their compilers' memory)",
        requires=("wan_frame_scan",),
    ),
)
