"""Convolutions by `kernels.conv.conv` with the target's `ConvPolicy`, and `CogVideoXSafeConv3d` unchunked."""

from __future__ import annotations

import functools

import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSafeConv3d

from cogvideox_torchax.kernels.conv import ConvPolicy, conv
from cogvideox_torchax.patches.base import Patch, add_mixin, interop, is_torchax, swap_classes


class ChunkFreeSafeConv3d(CogVideoXSafeConv3d):
    """`CogVideoXSafeConv3d` as the single convolution it computes.

    Upstream splits inputs over 2 GB (counted as if 2-byte elements) into time
    chunks with overlapping halos, a cuDNN workaround. Under XLA that only
    fragments one convolution into several and concatenates them; the result
    is the same, so we run the plain `nn.Conv3d` forward.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.nn.Conv3d.forward(self, input)


class FusedBiasConv:
    """Mixin: `_conv_forward` by `kernels.conv.conv` under torchax, as its `conv_policy` says.

    The policy (layout, where the bias is added, the split size) is the
    module's ``conv_policy`` attribute, set by `apply_conv_bias`.
    Overriding `_conv_forward`, not `forward`, keeps each class's own
    forward: upstream's chunked `CogVideoXSafeConv3d` still chunks, each
    chunk going through the kernel.
    """

    conv_policy: ConvPolicy = ConvPolicy()

    def _conv_forward(self, input, weight, bias):
        if not is_torchax(input) or self.padding_mode != "zeros" or isinstance(self.padding, str):
            return super()._conv_forward(input, weight, bias)
        fn = functools.partial(
            conv,
            stride=tuple(self.stride),
            padding=tuple(self.padding),
            dilation=tuple(self.dilation),
            groups=self.groups,
            **self.conv_policy.kwargs(),
        )
        return interop.torch_view(fn)(input, weight, bias)


def conv2d_per_frame(x, weight, bias, module: torch.nn.Conv2d):
    """``module`` (a ``Conv2d`` with its ``conv_policy``) on each frame of JAX ``(B, C, T, H, W)``: one 3-D convolution.

    The 2-D kernel ``(O, I, kh, kw)`` as ``(O, I, 1, kh, kw)``, one frame
    deep, so the activation is not moved to put frames next to the batch.
    """
    return conv(x, weight[:, :, None], bias, stride=(1, *module.stride), padding=(0, *module.padding),
                dilation=(1, *module.dilation), groups=module.groups, **module.conv_policy.kwargs())


class JaxConv2d(FusedBiasConv, torch.nn.Conv2d):
    """`nn.Conv2d` rounding once in bf16 and fp16 (see `FusedBiasConv`)."""


class JaxConv3d(FusedBiasConv, torch.nn.Conv3d):
    """`nn.Conv3d` rounding once in bf16 and fp16 (see `FusedBiasConv`)."""


class JaxSafeConv3d(FusedBiasConv, CogVideoXSafeConv3d):
    """Upstream's chunked `CogVideoXSafeConv3d`, each chunk rounding once."""


class JaxChunkFreeSafeConv3d(FusedBiasConv, ChunkFreeSafeConv3d):
    """`ChunkFreeSafeConv3d` rounding once in bf16 and fp16."""


def apply_safe_conv(vae: torch.nn.Module) -> int:
    """Makes every `CogVideoXSafeConv3d` in ``vae`` a `ChunkFreeSafeConv3d`.

    Composes with `apply_conv_bias` in either order.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {CogVideoXSafeConv3d: ChunkFreeSafeConv3d, JaxSafeConv3d: JaxChunkFreeSafeConv3d})


def apply_conv_bias(vae: torch.nn.Module, policy: ConvPolicy | None = None) -> int:
    """Makes every 2-D and 3-D convolution in ``vae`` run through `kernels.conv.conv` with ``policy``.

    The default policy adds the bias inside the fp32 accumulator (one
    rounding), channels-first, never split; `cogvideox_torchax.platforms.run_plan` picks
    one per backend. Covers `nn.Conv2d` (the upsamplers), `nn.Conv3d`,
    both kinds of `CogVideoXSafeConv3d`, and any other subclass of them (a
    `FusedBiasConv` mixin in front of its class: Wan's `WanCausalConv3d`). Composes with `apply_safe_conv` in
    either order; calling it again sets the new policy.

    Returns:
        How many modules changed class in this call (0 on a second call).
    """
    count = swap_classes(
        vae,
        {
            torch.nn.Conv2d: JaxConv2d,
            torch.nn.Conv3d: JaxConv3d,
            CogVideoXSafeConv3d: JaxSafeConv3d,
            ChunkFreeSafeConv3d: JaxChunkFreeSafeConv3d,
        },
    )
    for module in vae.modules():
        # Any other family's own convolution class (Wan's causal conv pads,
        # then calls `nn.Conv3d.forward`): the kernel behind its forward.
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Conv3d)) and not isinstance(module, FusedBiasConv):
            count += add_mixin(module, FusedBiasConv)
    for module in vae.modules():
        if isinstance(module, FusedBiasConv):
            module.conv_policy = policy or ConvPolicy()
    return count


def _chunk_free_why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.profile.gpu and "conv_bias" not in applied:
        return "on a GPU, upstream's chunking is the only guard against 2^31-element convolutions without conv_bias"
    return None


PATCHES = (
    Patch(
        "conv_bias", "ops",
        "Run every convolution through `kernels.conv` with the platform's `kernels.conv.ConvPolicy` (layout, "
        "bias rounding, splitting of convolutions too large for cuDNN); False keeps torchax's lowering.",
        lambda m, plan, mesh: apply_conv_bias(m, plan.conv),
    ),
    Patch(
        "chunk_free_conv", "ops",
        "Run `CogVideoXSafeConv3d` as one convolution instead of upstream's memory-size chunking. On a GPU only "
        "together with ``conv_bias``, whose kernel splits what cuDNN cannot take.",
        lambda m, plan, mesh: apply_safe_conv(m),
        families=("cogvideox",),
        # Its condition reads whether conv_bias was applied.
        after=("conv_bias",),
        why_not=_chunk_free_why_not,
    ),
)
