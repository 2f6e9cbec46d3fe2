"""`WanResample`'s 2-D convolutions as 3-D ones of kernel depth 1, on ``(B, C, T, H, W)`` as it stands.

Upstream moves frames next to the batch (``permute(0, 2, 1, 3, 4)``) to
resize and convolve ``(B * T, C, H, W)`` in 2-D, then moves them back.
Frame by frame that is a nearest-exact resize of height and width and a
3-D convolution of kernel ``(1, 3, 3)`` (the downsamplers: a zero pad of one
row and column, stride ``(1, 2, 2)``); written so, the values are
upstream's and nothing is permuted. The time convolutions and their caches
stay upstream's code.

Why: XLA GPU lays bf16 2-D convolutions out NHWC and 3-D ones NCDHW, so
each resampler was an island of another layout (Wan 2.1 at 720p x 81,
compiled for an H200: 10 NHWC convolutions and 43 activation-sized
transposes before with the attention block's, none after:
docs/results/wan-compiled-targets-2026-11-28.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import CACHE_T, WanResample

from cogvideox_torchax.kernels.upsample import nearest
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes
from cogvideox_torchax.patches.conv import conv2d_per_frame


def upsample(x: jax.Array, weight: jax.Array, bias: jax.Array | None, c: torch.nn.Conv2d) -> jax.Array:
    """``WanUpsample(scale 2, "nearest-exact")`` and the ``Conv2d`` behind it, on ``(B, C, T, H, W)``."""
    t, h, w = x.shape[2:]
    return conv2d_per_frame(nearest(x, (t, 2 * h, 2 * w), (None, 2.0, 2.0), exact=True), weight, bias, c)


def downsample(x: jax.Array, weight: jax.Array, bias: jax.Array | None, c: torch.nn.Conv2d) -> jax.Array:
    """``ZeroPad2d((0, 1, 0, 1))`` and the stride-2 ``Conv2d`` behind it, on ``(B, C, T, H, W)``."""
    return conv2d_per_frame(jnp.pad(x, [(0, 0)] * 3 + [(0, 1), (0, 1)]), weight, bias, c)


class Conv3dWanResample(WanResample):
    """`WanResample` whose resize and 2-D convolution run as one depth-1 3-D convolution (torchax only).

    The control flow, caches included, is upstream's ``forward``, line for
    line; only the part between the two permutes differs.
    """

    def forward(self, x: torch.Tensor, feat_cache=None, feat_idx=[0]) -> torch.Tensor:  # noqa: B006 (upstream's)
        conv2d = self.resample[1] if isinstance(self.resample, torch.nn.Sequential) else None
        if conv2d is None or not is_torchax(x) or not hasattr(conv2d, "conv_policy"):
            return super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx)
        b, c, t, h, w = x.size()
        if self.mode == "upsample3d" and feat_cache is not None:
            idx = feat_idx[0]
            if feat_cache[idx] is None:
                feat_cache[idx] = "Rep"
                feat_idx[0] += 1
            else:
                rep = isinstance(feat_cache[idx], str)
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and not rep:
                    cache_x = torch.cat([feat_cache[idx][:, :, -1, :, :].unsqueeze(2), cache_x], dim=2)
                if cache_x.shape[2] < 2 and rep:
                    cache_x = torch.cat([torch.zeros_like(cache_x), cache_x], dim=2)
                x = self.time_conv(x) if rep else self.time_conv(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
                x = x.reshape(b, 2, c, t, h, w)
                x = torch.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]), 3)
                x = x.reshape(b, c, t * 2, h, w)
        spatial = upsample if self.mode.startswith("upsample") else downsample
        x = interop.torch_view(lambda v, wt, bs: spatial(v, wt, bs, conv2d))(x, conv2d.weight, conv2d.bias)
        if self.mode == "downsample3d" and feat_cache is not None:
            idx = feat_idx[0]
            if feat_cache[idx] is None:
                feat_cache[idx] = x.clone()
                feat_idx[0] += 1
            else:
                cache_x = x[:, :, -1:, :, :].clone()
                x = self.time_conv(torch.cat([feat_cache[idx][:, :, -1:, :, :], x], 2))
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
        return x


def apply_resample_conv3d(vae: torch.nn.Module) -> int:
    """Makes every `WanResample` in ``vae`` a `Conv3dWanResample`.

    Apply it after `cogvideox_torchax.patches.conv.apply_conv_bias` (its
    convolutions read their policy) and before the mixins of later stages.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {WanResample: Conv3dWanResample})


PATCHES = (
    Patch(
        "wan_resample_conv3d", "layers",
        "`WanResample` resizes and convolves ``(B, C, T, H, W)`` as it stands, one 3-D convolution of kernel depth "
        "1, instead of moving frames next to the batch for a 2-D convolution: on CUDA, XLA lays 2-D convolutions "
        "out NHWC and 3-D ones NCDHW, and the islands cost activation-sized transposes.",
        lambda m, plan, mesh: apply_resample_conv3d(m),
        families=("wan",),
        platforms=("cuda", "tpu"),
        platforms_why="measured on CUDA and TPU only (their compilers' layouts and memory)",
        requires=("conv_bias",),
    ),
)
