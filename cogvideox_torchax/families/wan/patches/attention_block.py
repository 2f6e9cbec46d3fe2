"""`WanAttentionBlock` on ``(B, C, T, H, W)`` as it stands: its 1x1 convolutions 3-D, no frames moved to the batch.

Upstream moves frames next to the batch (``permute(0, 2, 1, 3, 4)``),
norms and projects ``(B * T, C, H, W)`` with two 1x1 2-D convolutions,
attends over each frame's pixels and moves the frames back. Per pixel
the norm is over channels and the projections are per pixel too, so they
run on the activation as it stands (the norm on a ``(B, C, T * H, W)``
view, the projections as 1x1x1 3-D convolutions), and the attention over
each frame's pixels is `wan_attention`'s arithmetic on channels-first
operands (`kernels.channel_attention`: fp32 logits and softmax, one
rounding, no transposed copy of the queries, keys, values or result).
Upstream's values, to `wan_attention`'s rounding.

Why: XLA GPU lays bf16 2-D convolutions out NHWC, 3-D ones NCDHW; the
block's 2-D convolutions were the last NHWC ones of the CUDA program,
with activation transposes into and out of them (docs/design.md, "Wan's
accelerator programs"; figures in docs/results/wan-compiled-targets-2026-11-28.md).
"""

from __future__ import annotations

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock

from cogvideox_torchax.kernels.channel_attention import attention_channels_first
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes
from cogvideox_torchax.patches.conv import conv2d_per_frame


def _pointwise(module: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``module`` (a 1x1 ``Conv2d``) on ``(B, C, T, H, W)`` as a 1x1x1 3-D convolution with its policy."""
    return interop.torch_view(lambda v, w, b: conv2d_per_frame(v, w, b, module))(x, module.weight, module.bias)


class ChannelsFirstWanAttentionBlock(WanAttentionBlock):
    """`WanAttentionBlock` without moving frames next to the batch (torchax, convolutions with a policy)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not is_torchax(x) or not hasattr(self.to_qkv, "conv_policy") or not hasattr(self.proj, "conv_policy"):
            return super().forward(x)
        identity = x
        b, c, t, h, w = x.shape
        # The norm is over channels, per pixel: a (B, C, T * H, W) view is what its (C, 1, 1) gain broadcasts over.
        x = self.norm(x.reshape(b, c, t * h, w)).reshape(b, c, t, h, w)
        qkv = _pointwise(self.to_qkv, x)

        def attend(qkv):
            # Upstream's q, k, v: channels [0, C), [C, 2C), [2C, 3C) of each pixel; each frame's pixels attend.
            q, k, v = (qkv[:, i * c : (i + 1) * c].reshape(b, c, t, h * w) for i in range(3))
            if t > 1:
                q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, T, C, L)
                return attention_channels_first(q, k, v).transpose(0, 2, 1, 3).reshape(b, c, t, h, w)
            return attention_channels_first(q[:, :, 0], k[:, :, 0], v[:, :, 0]).reshape(b, c, t, h, w)

        return _pointwise(self.proj, interop.torch_view(attend)(qkv)) + identity


def apply_attention_block(vae: torch.nn.Module) -> int:
    """Makes every `WanAttentionBlock` in ``vae`` a `ChannelsFirstWanAttentionBlock` (after ``conv_bias``).

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {WanAttentionBlock: ChannelsFirstWanAttentionBlock})


PATCHES = (
    Patch(
        "wan_attention_block", "layers",
        "`WanAttentionBlock` norms and projects ``(B, C, T, H, W)`` as it stands (1x1x1 3-D convolutions) and "
        "attends over each frame's pixels channels-first (`kernels.channel_attention`, `wan_attention`'s "
        "arithmetic) without moving frames next to the batch: on CUDA, XLA lays 2-D convolutions out NHWC and 3-D "
        "ones NCDHW, and the block's 2-D convolutions and token-major attention cost activation transposes.",
        lambda m, plan, mesh: apply_attention_block(m),
        families=("wan",),
        platforms=("cuda", "tpu"),
        platforms_why="measured on CUDA and TPU only (their compilers' layouts and memory)",
        requires=("conv_bias", "wan_attention"),
    ),
)
