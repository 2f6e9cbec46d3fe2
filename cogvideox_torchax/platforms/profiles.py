"""One record per platform: every platform-dependent choice the plan and the patches read.

The plan (`cogvideox_torchax.platforms.build`) and the patches never test a
platform's name; they read its `PlatformProfile`, and a patch measured on
some platforms only names them in its own record (`Patch.platforms`). Adding a platform is one
record in `PROFILES`; a named accelerator of a known platform is one row of
`cogvideox_torchax.platforms.accelerators`. The measurements behind each
choice are in the handbook's design notes (docs/design.md, "Per-backend
choices").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jax.sharding import Mesh

# Below 2^31 elements: cuDNN's limit for speed on GPUs; per device on TPUs,
# where the compiler's two copies of a padded input cost the memory.
MAX_CONV_ELEMENTS = 2**31 - 1

# XLA:CPU runs OptimizationBarrierExpander, which deletes every
# `optimization_barrier` before fusion and scheduling; its programs are
# compiled with this option so the barriers of `CacheFirstCausalConv3d` stay
# (GPU and TPU keep barriers anyway).
KEEP_BARRIERS_COMPILER_OPTIONS = MappingProxyType({"xla_disable_hlo_passes": "cse_barrier_expander"})

# jax 0.11 turned XLA:GPU's latency-hiding scheduler on (jax 0.10.2 left it
# off): compiled for an H200, it reorders the frame loop's body and the 2b
# decode at 480x720 needs 5.93 GiB instead of 5.80 (5.69 with it off on
# jax 0.12). A single device's decode has no collectives for it to hide.
GPU_SCHEDULE_COMPILER_OPTIONS = MappingProxyType({"xla_gpu_enable_latency_hiding_scheduler": False})

CONV_LAYOUTS = ("channels-last", "channels-first", "xla")
BIAS_RULES = ("accumulator", "fused", "after rounding")


@dataclasses.dataclass(frozen=True)
class PlatformProfile:
    """What one platform runs: convolution layout, bias rounding, split size, compiler options.

    Attributes:
        name: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``.
        gpu: a GPU platform (cuDNN-style convolution limits).
        conv_layout: how `kernels.conv` lays convolutions out:
            ``"channels-last"`` (explicit transposes around each),
            ``"channels-first"`` (NCDHW, as the GPU compiler keeps it) or
            ``"xla"`` (channels-first in the program, the layout left to the
            compiler's layout assignment).
        bias: where a bf16 convolution adds its bias: ``"accumulator"``
            (fp32, one rounding), ``"fused"`` (written ``bf16 conv + bias``,
            which the compiler fuses into cuDNN's fp32 conv-bias epilogue:
            one rounding, no fp32 activation) or ``"after rounding"`` (the
            TPU compiler writes an fp32 epilogue out). fp16 and fp32 always
            add it in the accumulator.
        max_conv_elements: split a convolution whose operand or result
            would hold more elements than this; None never splits.
        split_per_device: ``max_conv_elements`` counts one device's share
            under width sharding (multiplied by ``tp``).
        materialise_padded: causal convolutions put their padded input
            behind the cache barrier (the convolutions read it whole).
        block_broadcast: SpatialNorm's scale and shift resized without a
            full-size gather.
        keep_barriers: compiler options that keep the optimization barriers
            ``cache_first`` orders its conv caches with.
        compiler_options: XLA options every program of the platform is
            compiled with, whichever patches apply.
    """

    name: str
    gpu: bool
    conv_layout: str
    bias: str
    max_conv_elements: int | None
    split_per_device: bool = False
    materialise_padded: bool = False
    block_broadcast: bool = False
    keep_barriers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.conv_layout not in CONV_LAYOUTS:
            raise ValueError(f"conv_layout must be one of {CONV_LAYOUTS}, got {self.conv_layout!r}")
        if self.bias not in BIAS_RULES:
            raise ValueError(f"bias must be one of {BIAS_RULES}, got {self.bias!r}")
        object.__setattr__(self, "keep_barriers", MappingProxyType(dict(self.keep_barriers)))
        object.__setattr__(self, "compiler_options", MappingProxyType(dict(self.compiler_options)))

    def __hash__(self) -> int:
        return hash(self.name)


PROFILES: Mapping[str, PlatformProfile] = MappingProxyType({
    p.name: p
    for p in (
        # XLA:CPU runs channels-first far slower inside the frame-batch scan,
        # and 2-D convolutions faster than 3-D ones; it drops optimization
        # barriers unless told to keep them.
        PlatformProfile(
            "cpu", gpu=False, conv_layout="channels-last", bias="accumulator", max_conv_elements=None,
            keep_barriers=KEEP_BARRIERS_COMPILER_OPTIONS,
        ),
        PlatformProfile(
            "cuda", gpu=True, conv_layout="channels-first", bias="fused", max_conv_elements=MAX_CONV_ELEMENTS,
            materialise_padded=True,
            compiler_options=GPU_SCHEDULE_COMPILER_OPTIONS,
        ),
        # Never compiled or run here: the CPU's layout and bias, the GPU's limit.
        PlatformProfile(
            "rocm", gpu=True, conv_layout="channels-last", bias="after rounding", max_conv_elements=MAX_CONV_ELEMENTS,
        ),
        # Time chunks made the whole-chip program larger on TPU.
        PlatformProfile(
            "tpu", gpu=False, conv_layout="xla", bias="after rounding", max_conv_elements=MAX_CONV_ELEMENTS,
            split_per_device=True, materialise_padded=True, block_broadcast=True,
        ),
    )
})

PLATFORMS = tuple(PROFILES)
_ALIASES = {"gpu": "cuda"}


def canonical_platform(platform: str) -> str:
    """A key of `PROFILES` (``"gpu"`` means CUDA).

    Raises:
        ValueError: for any other name.
    """
    name = _ALIASES.get(str(platform).lower(), str(platform).lower())
    if name not in PROFILES:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)} (or gpu), got {platform!r}")
    return name


def profile(platform: str) -> PlatformProfile:
    """The `PlatformProfile` of ``platform`` (any spelling `canonical_platform` takes)."""
    return PROFILES[canonical_platform(platform)]


def mesh_platform(mesh: Mesh) -> str:
    """The platform of the mesh's devices, as `canonical_platform` names it."""
    device = mesh.devices.flat[0]
    if device.platform == "gpu":
        return "rocm" if "rocm" in str(getattr(device.client, "platform_version", "")).lower() else "cuda"
    return canonical_platform(device.platform)
