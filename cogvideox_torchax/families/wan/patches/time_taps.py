"""Wan's causal convolutions on the CPU in fp32 as one 2-D convolution per time tap (`kernels.tap_conv`).

`WanCausalConv3d` joins its cache before its input, pads time with zeros
and runs one 3-D convolution; XLA:CPU runs 3-D convolutions at about half
the speed of the same work as 2-D ones, summed. Here each time tap is one
channels-last 2-D convolution of the frames it reads, the frames in the
batch, summed in fp32; taps that would read only the causal padding's zero
frames are not computed. The cache stays upstream's (input frames, which
the blocks take before calling the convolution), so nothing else changes.
Measurements: docs/design.md, "Wan on the CPU: time taps from the cache".
"""

from __future__ import annotations

import functools

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

from cogvideox_torchax.kernels.tap_conv import tap_conv3d
from cogvideox_torchax.patches.base import Patch, add_mixin, interop, is_torchax, keep_barriers


def _taps_apply(module: WanCausalConv3d) -> bool:
    # Upstream moves the padding to `_padding` (F.pad's order: W, W, H, H, front, back).
    w_left, w_right, h_top, h_bottom, _, back = module._padding
    return (
        module.groups == 1
        and module.padding_mode == "zeros"
        and tuple(module.padding) == (0, 0, 0)
        and w_left == w_right
        and h_top == h_bottom
        and back == 0
    )


class TimeTapConvMixin:
    """A `WanCausalConv3d` computed by `kernels.tap_conv.tap_conv3d` under torchax (upstream's forward otherwise)."""

    # The CPU's programs take this weight as upstream holds it (`vae.weight_layout`): given transposed, XLA
    # made every tap's kernel once per call before Wan's frame loop and held them through it (Wan 2.1 at
    # 9 x 128x128: 0.29 GB more temporaries, and on jax 0.12 slower), where it now slices them in each step.
    keeps_upstream_weight_layout = True

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        if not is_torchax(x) or not _taps_apply(self):
            return super().forward(x, cache_x)
        time_padding = self._padding[4]
        fn = functools.partial(
            tap_conv3d,
            time_padding=time_padding,
            padding_hw=(self._padding[2], self._padding[0]),
            stride=tuple(self.stride),
            dilation=tuple(self.dilation),
        )
        # Upstream reads the cache only where the convolution pads time.
        cache = cache_x if time_padding > 0 else None
        return interop.torch_view(fn)(x, cache, self.weight, self.bias)


def apply_time_taps(vae: torch.nn.Module) -> int:
    """Gives every `WanCausalConv3d` in ``vae`` the `TimeTapConvMixin` (in front of any other patch of its class).

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return sum(add_mixin(m, TimeTapConvMixin) for m in vae.modules() if isinstance(m, WanCausalConv3d))


def _why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.dtype != "float32":
        return "fp32 only: in bf16 and fp16 each tap's fp32 product would be an activation-sized fp32 tensor"
    return None


PATCHES = (
    Patch(
        "wan_time_taps", "layers",
        "Run `WanCausalConv3d` as one channels-last 2-D convolution per time tap of the cache joined before its "
        "input (`kernels.tap_conv`), summed in fp32, skipping taps that read only zero padding: XLA:CPU's 3-D "
        "convolution is about half as fast. CPU and fp32 only.",
        lambda m, plan, mesh: apply_time_taps(m),
        families=("wan",),
        platforms=("cpu",),
        platforms_why="GPU and TPU run each causal conv as one 3-D convolution; time taps only work around "
                      "XLA:CPU's slow 3-D convolution",
        after=("conv_bias",),
        why_not=_why_not,
        # The kernel's output barrier holds only where barriers are kept (the frame scan's is kept with it).
        compiler_options=keep_barriers,
    ),
)
