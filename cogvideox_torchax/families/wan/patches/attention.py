"""The middle block's single-head attention by `kernels.attention`: an op override while tracing."""

from __future__ import annotations

from typing import Any

import torch

from cogvideox_torchax.kernels.attention import attention
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, torchax


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False) -> Any:
    """``F.scaled_dot_product_attention`` without mask, dropout or causality by `kernels.attention`; else torchax's."""
    if attn_mask is not None or dropout_p or is_causal or scale is not None or enable_gqa or not is_torchax(query):
        raise torchax.tensor.OperatorNotFound("masked, dropped, causal or scaled: torchax's own path")
    return interop.torch_view(attention)(query, key, value)


# Not a module patch: the traced call scopes it (`registry.environment`).
PATCHES = (
    Patch(
        "wan_attention", "ops",
        "``F.scaled_dot_product_attention`` (the middle blocks' single head over a frame's pixels) by "
        "`kernels.attention`: fp32 logits and softmax, one rounding, queries in blocks (torchax's reference holds "
        "every logit in the activation dtype). Acts while tracing.",
        None,
        families=("wan",),
        overrides=lambda: {torch.nn.functional.scaled_dot_product_attention: _attention},
    ),
)
