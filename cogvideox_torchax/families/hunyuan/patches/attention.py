"""HunyuanVideo's (1.0 and 1.5) middle-block attention over the whole video's tokens, frame-causal without the mask.

Upstream's `HunyuanVideoMidBlock3D` flattens ``(B, C, T, H, W)`` to
``T * H * W`` tokens and attends with a ``tokens x tokens`` mask
(``prepare_causal_attention_mask``: each token sees its own and earlier
frames), quadratic in the video's tokens. Here the block is upstream's
arithmetic (the same resnets, the attention's group norm, projections,
residual and rescale) with the attention itself computed blockwise by
`kernels.frame_causal_attention`: no mask, the key blocks the mask removes
never computed, memory linear in tokens. A processor other than upstream's
default (a user's own) runs upstream's own path. 1.5's `HunyuanVideo15AttnBlock`
(RMS norm, 1x1x1 convolutions, one head over the channels, the same mask
built by a Python loop over every token) the same way.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoMidBlock3D
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

from cogvideox_torchax.kernels.frame_causal_attention import frame_causal_attention
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes

# The processors whose arithmetic `_attend` is (upstream's defaults).
_DEFAULT_PROCESSORS = (AttnProcessor, AttnProcessor2_0)


def _attend(attn: torch.nn.Module, tokens: torch.Tensor, frame_tokens: int) -> torch.Tensor:
    """``attn(tokens, attention_mask=<frame-causal mask>)`` as upstream's default processor computes it, maskless."""
    residual = tokens
    batch, length, _ = tokens.shape
    if attn.group_norm is not None:
        tokens = attn.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
    query, key, value = attn.to_q(tokens), attn.to_k(tokens), attn.to_v(tokens)
    heads = attn.heads
    query, key, value = (t.view(batch, length, heads, t.shape[-1] // heads).transpose(1, 2)
                         for t in (query, key, value))
    out = interop.torch_view(lambda q, k, v: frame_causal_attention(q, k, v, frame_tokens=frame_tokens))(
        query, key, value)
    out = out.transpose(1, 2).reshape(batch, length, -1).to(query.dtype)
    out = attn.to_out[1](attn.to_out[0](out))
    if attn.residual_connection:
        out = out + residual
    return out / attn.rescale_output_factor


def _maskless(attn: torch.nn.Module) -> bool:
    # Upstream's default processor with nothing that would change its arithmetic.
    return (type(attn.processor) in _DEFAULT_PROCESSORS and attn.spatial_norm is None and attn.norm_q is None
            and attn.norm_k is None and not attn.is_cross_attention)


class FrameCausalMidBlock(HunyuanVideoMidBlock3D):
    """`HunyuanVideoMidBlock3D` whose attention is `kernels.frame_causal_attention` (torchax only)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not is_torchax(hidden_states) or not all(a is None or _maskless(a) for a in self.attentions):
            return super().forward(hidden_states)
        hidden_states = self.resnets[0](hidden_states)
        for attn, resnet in zip(self.attentions, self.resnets[1:], strict=True):
            if attn is not None:
                batch, channels, frames, height, width = hidden_states.shape
                tokens = hidden_states.permute(0, 2, 3, 4, 1).flatten(1, 3)
                tokens = _attend(attn, tokens, height * width)
                hidden_states = tokens.unflatten(1, (frames, height, width)).permute(0, 4, 1, 2, 3)
            hidden_states = resnet(hidden_states)
        return hidden_states


class FrameCausalAttnBlock15(HunyuanVideo15AttnBlock):
    """1.5's `HunyuanVideo15AttnBlock` whose attention is `kernels.frame_causal_attention` (torchax only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not is_torchax(x):
            return super().forward(x)
        identity = x
        x = self.norm(x)
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)
        batch, channels, frames, height, width = query.shape
        query, key, value = (t.reshape(batch, channels, frames * height * width).permute(0, 2, 1).unsqueeze(1)
                             for t in (query, key, value))
        x = interop.torch_view(lambda q, k, v: frame_causal_attention(q, k, v, frame_tokens=height * width))(
            query, key, value)
        x = x.squeeze(1).reshape(batch, frames, height, width, channels).permute(0, 4, 1, 2, 3)
        return self.proj_out(x) + identity


def apply_frame_causal_attention(vae: torch.nn.Module) -> int:
    """Makes every `HunyuanVideoMidBlock3D` a `FrameCausalMidBlock`, every `HunyuanVideo15AttnBlock` a
    `FrameCausalAttnBlock15`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {HunyuanVideoMidBlock3D: FrameCausalMidBlock,
                              HunyuanVideo15AttnBlock: FrameCausalAttnBlock15})


PATCHES = (
    Patch(
        "hunyuan_frame_causal_attention", "blocks",
        "The middle blocks' attention over every token of the video, each seeing its own and earlier frames, "
        "computed blockwise (`kernels.frame_causal_attention`: online softmax in fp32, the key blocks upstream's "
        "mask removes never computed) instead of upstream's dense tokens x tokens mask: memory linear in tokens.",
        lambda m, plan, mesh: apply_frame_causal_attention(m),
        families=("hunyuan", "hunyuan15"),
    ),
)
