"""What runs for one placement: the data of a run plan, built by `cogvideox_torchax.platforms.build`.

A `Placement` is what a program is built for (platform, dtype, mesh shape),
not the machine Python runs on, so a CUDA or TPU program can be built and
inspected on a CPU. A `RunPlan` says which patch switches apply to it (in
the order they are applied), which were left out and why, and the
`kernels.conv.ConvPolicy` every convolution runs with.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from cogvideox_torchax import families
from cogvideox_torchax.config import canonical_dtype
from cogvideox_torchax.kernels.conv import ConvPolicy
from cogvideox_torchax.platforms.profiles import PROFILES, PlatformProfile, canonical_platform, mesh_platform

if TYPE_CHECKING:
    from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class Placement:
    """What a program is built for: platform, dtype and mesh shape."""

    platform: str
    dtype: str
    dp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "platform", canonical_platform(self.platform))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @classmethod
    def of(cls, mesh: Mesh, dtype: str, platform: str | None = None) -> Placement:
        """The placement of a program over ``mesh``, built for ``platform`` (default: the mesh's own)."""
        return cls(platform or mesh_platform(mesh), dtype, mesh.shape["dp"], mesh.shape["tp"])

    @property
    def profile(self) -> PlatformProfile:
        """The platform's `PlatformProfile`."""
        return PROFILES[self.platform]

    @property
    def is_gpu(self) -> bool:
        return self.profile.gpu


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What runs for one placement.

    Attributes:
        placement: the platform, dtype and mesh shape the program is built for.
        steps: the patch switches applied, in order.
        skipped: ``(switch, why)`` for each switch left on auto that does
            not apply to this placement.
        conv: the policy of every convolution (None without ``conv_bias``:
            torchax's own lowering).
        family: the model family whose patches these are (`cogvideox_torchax.families`).
    """

    placement: Placement
    steps: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    conv: ConvPolicy | None
    family: str = families.DEFAULT.name

    def applies(self, name: str) -> bool:
        """Whether the switch ``name`` is part of this plan."""
        return name in self.steps

    @property
    def conv_layout(self) -> str:
        """The profile's `PlatformProfile.conv_layout`; ``"channels-first"`` (torchax's) without ``conv_bias``."""
        if self.conv is None:
            return "channels-first"
        if self.applies("time_tap_conv"):
            return "channels-last, time taps"
        if self.applies("host_conv"):
            return f"{self.placement.profile.conv_layout}, the host's torch where oneDNN is the faster"
        return self.placement.profile.conv_layout

    def _bias_words(self) -> str:
        if not self.conv.bias_in_fp32:
            return "after rounding"
        return "fp32 accumulator" + (" (cuDNN conv-bias epilogue)" if self.conv.fused_bias else "")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able description (the CLI's ``--json`` and the bench report carry it)."""
        conv = None
        if self.conv is not None:
            conv = {
                "layout": self.conv_layout,
                "bias": self._bias_words(),
                "max_elements": self.conv.max_elements,
            }
        return {
            # "target": the key earlier versions wrote; readers of --json keep it.
            "target": dataclasses.asdict(self.placement),
            "family": self.family,
            "steps": list(self.steps),
            "skipped": dict(self.skipped),
            "conv": conv,
        }

    def __str__(self) -> str:
        t = self.placement
        conv = "torchax convs"
        if self.conv is not None:
            bias = f"bias: {self._bias_words()}"
            split = "" if self.conv.max_elements is None else f", split above {self.conv.max_elements} elements"
            conv = f"convs {self.conv_layout}, {bias}{split}"
        return f"{t.platform} {t.dtype} dp={t.dp},tp={t.tp}: {', '.join(self.steps) or 'no patches'}; {conv}"
