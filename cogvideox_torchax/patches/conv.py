"""Every family's convolutions by `kernels.conv.conv` with the target's `ConvPolicy` (``conv_bias``)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from cogvideox_torchax.kernels.conv import ConvPolicy, conv
from cogvideox_torchax.kernels.reflect_pad import reflect_pad
from cogvideox_torchax.patches.base import Patch, add_mixin, interop, is_torchax, swap_classes


class FusedBiasConv:
    """Mixin: `_conv_forward` by `kernels.conv.conv` under torchax, as its `conv_policy` says.

    The policy (layout, where the bias is added, the split size) is the
    module's ``conv_policy`` attribute, set by `apply_conv_bias`.
    Overriding `_conv_forward`, not `forward`, keeps each class's own
    forward: a family's convolution that pads or chunks before calling
    ``_conv_forward`` (CogVideoX's chunked `CogVideoXSafeConv3d`) still
    does, each chunk going through the kernel.
    """

    conv_policy: ConvPolicy = ConvPolicy()
    # Set by a family's patch (LTX-2's `zero_pad_reflection`): pad by `kernels.reflect_pad`.
    reflect_by_zero_pad: bool = False

    def _conv_forward(self, input, weight, bias):
        if not is_torchax(input) or isinstance(self.padding, str):
            return super()._conv_forward(input, weight, bias)
        padding = tuple(self.padding)
        if self.padding_mode == "reflect" and self.reflect_by_zero_pad:
            input = interop.torch_view(functools.partial(reflect_pad, pads=padding))(input)
            padding = (0,) * len(padding)
        elif self.padding_mode != "zeros":
            # As torch's own _conv_forward: the module's padding (LTX-2's
            # reflection) made explicitly, then a convolution that pads nothing.
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = (0,) * len(padding)
        fn = functools.partial(
            conv,
            stride=tuple(self.stride),
            padding=padding,
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


def apply_conv_bias(vae: torch.nn.Module, policy: ConvPolicy | None = None) -> int:
    """Makes every 2-D and 3-D convolution in ``vae`` run through `kernels.conv.conv` with ``policy``.

    The default policy adds the bias inside the fp32 accumulator (one
    rounding), channels-first, never split; `cogvideox_torchax.platforms.run_plan` picks
    one per backend. Covers `nn.Conv2d` (the upsamplers), `nn.Conv3d`, and
    every family's own subclass of them, with a `FusedBiasConv` mixin in
    front of its class (`base.add_mixin`: CogVideoX's `CogVideoXSafeConv3d`,
    Wan's `WanCausalConv3d`). A family patch that swaps such a class maps
    the mixed class too (`base.mixed`), so it composes with this one in
    either order; calling it again sets the new policy.

    Returns:
        How many modules changed class in this call (0 on a second call).
    """
    count = swap_classes(vae, {torch.nn.Conv2d: JaxConv2d, torch.nn.Conv3d: JaxConv3d})
    for module in vae.modules():
        # A family's own convolution class (it pads or chunks, then calls
        # `_conv_forward`): the kernel behind its forward.
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Conv3d)) and not isinstance(module, FusedBiasConv):
            count += add_mixin(module, FusedBiasConv)
    for module in vae.modules():
        if isinstance(module, FusedBiasConv):
            module.conv_policy = policy or ConvPolicy()
    return count


PATCHES = (
    Patch(
        "conv_bias", "ops",
        "Run every convolution through `kernels.conv` with the platform's `kernels.conv.ConvPolicy` (layout, "
        "bias rounding, splitting of convolutions too large for cuDNN); False keeps torchax's lowering.",
        lambda m, plan, mesh: apply_conv_bias(m, plan.conv),
    ),
)
