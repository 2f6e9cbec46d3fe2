"""Upsamplers and downsamplers as 3-D convolutions of kernel depth 1, on the activation as it stands.

Upstream's `CogVideoXUpsample3D` and `CogVideoXDownsample3D` move frames
next to the batch (``permute(0, 2, 1, 3, 4)``) to run a 2-D convolution on
``(B * T, C, H, W)``, then move them back; the downsampler also averages
frame pairs with a 1-D pool over ``(B * H * W, C, T)``. Frame by frame, the
2-D convolution is a 3-D one of kernel ``(1, kh, kw)`` on ``(B, C, T, H, W)``,
and both resamplings in time are index arithmetic on the time axis. Written
so, the values are upstream's and nothing is permuted.

Why: XLA GPU lays bf16 2-D convolutions out NHWC and 3-D ones NCDHW, so each
resampler was an island of another layout with activation-sized transposes
into and out of it (compiled for an H200, 2b decode at (1,16,13,60,90): 36
activation transposes and 6 NHWC convolutions before, none after).
`cogvideox_torchax.platforms.run_plan` applies it on CUDA (``resample_conv3d``).

The convolutions run through `kernels.conv.conv` with the resampler's
``conv`` policy (`patches.apply_conv_bias` must come first; without a
policy the module runs upstream's code).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from diffusers.models.downsampling import CogVideoXDownsample3D
from diffusers.models.upsampling import CogVideoXUpsample3D

from cogvideox_torchax.kernels.upsample import first_frame_apart_indices, nearest, take_indices
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes
from cogvideox_torchax.patches.conv import conv2d_per_frame


def _applies(module: torch.nn.Module, inputs: torch.Tensor) -> bool:
    c = module.conv
    return (is_torchax(inputs) and hasattr(c, "conv_policy") and c.padding_mode == "zeros"
            and not isinstance(c.padding, str))


def upsample(x: jax.Array, compress_time: bool) -> jax.Array:
    """Upstream's upsampler resize (scale 2) of ``(B, C, T, H, W)``, by `kernels.upsample.nearest`.

    With ``compress_time`` the frames double too, except that the first of
    an odd number above one is resized alone (kept once, not doubled).
    """
    t, h, w = x.shape[2:]
    if compress_time and t > 1 and t % 2 == 1:
        frames = first_frame_apart_indices(t, 2 * (t - 1) + 1, 2.0)
        x, compress_time = take_indices(x, frames, 2), False
    t = x.shape[2]
    if compress_time and t > 1:
        return nearest(x, (2 * t, 2 * h, 2 * w), (2.0, 2.0, 2.0))
    return nearest(x, (t, 2 * h, 2 * w), (None, 2.0, 2.0))


def halve_time(x: jax.Array) -> jax.Array:
    """Upstream's downsampler in time: frame pairs averaged, an odd first frame kept as it is.

    The mean is taken in fp32 and rounded once, as torch's ``avg_pool1d``.
    """
    t = x.shape[2]
    first, rest = (x[:, :, :1], x[:, :, 1:]) if t % 2 == 1 else (None, x)
    if rest.shape[2]:  # an even number of frames: upstream's pool never drops one
        f32 = rest.astype(jnp.float32)
        rest = ((f32[:, :, 0::2] + f32[:, :, 1::2]) * 0.5).astype(x.dtype)
    return rest if first is None else jnp.concatenate([first, rest], axis=2)


class Conv3dUpsample3D(CogVideoXUpsample3D):
    """`CogVideoXUpsample3D` as one resize (`upsample`) and one depth-1 3-D convolution."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not _applies(self, inputs):
            return super().forward(inputs)

        def run(x, weight, bias):
            return conv2d_per_frame(upsample(x, self.compress_time), weight, bias, self.conv)

        return interop.torch_view(run)(inputs, self.conv.weight, self.conv.bias)


class Conv3dDownsample3D(CogVideoXDownsample3D):
    """`CogVideoXDownsample3D` as frame-pair means (`halve_time`), its zero pad, one depth-1 3-D convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _applies(self, x):
            return super().forward(x)

        def run(x, weight, bias):
            if self.compress_time:
                x = halve_time(x)
            x = jnp.pad(x, [(0, 0)] * 3 + [(0, 1), (0, 1)])  # upstream's F.pad(x, (0, 1, 0, 1))
            return conv2d_per_frame(x, weight, bias, self.conv)

        return interop.torch_view(run)(x, self.conv.weight, self.conv.bias)


_SWAPS = {CogVideoXUpsample3D: Conv3dUpsample3D, CogVideoXDownsample3D: Conv3dDownsample3D}


def apply_resample_conv3d(vae: torch.nn.Module) -> int:
    """Makes every upstream upsampler and downsampler in ``vae`` its depth-1 3-D convolution form.

    Apply it after `patches.apply_conv_bias` and before
    `patches.apply_width_sharding` (which composes onto exact classes).

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, _SWAPS)


PATCHES = (
    Patch(
        "resample_conv3d", "layers",
        "The upsamplers and downsamplers resize and convolve ``(B, C, T, H, W)`` as it stands, one 3-D "
        "convolution of kernel depth 1, instead of moving frames next to the batch for a 2-D convolution: on CUDA, "
        "XLA lays 2-D convolutions out NHWC and 3-D ones NCDHW, and the islands cost activation-sized transposes; "
        "on TPU the program needs less memory.",
        lambda m, plan, mesh: apply_resample_conv3d(m),
        families=("cogvideox",),
        platforms=("cuda", "tpu"),
        platforms_why="measured on CUDA and TPU only (their compilers' layouts and memory)",
        requires=("conv_bias",),
    ),
)
