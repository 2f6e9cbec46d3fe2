"""What runs on a target: the patches and convolution policy for one platform, dtype and mesh.

A `RunPlan` is data: which optimisations apply (in the order they are
applied), which switches of `RuntimeOptions` were left out and why, and the
`kernels.conv.ConvPolicy` every convolution runs with. `build_plan` makes it
from the options and a `Target`; `apply_plan` patches a module with it. The
target is the platform the program is *built for*, not the machine Python
runs on, so a CUDA or TPU program can be built and inspected on a CPU.

Per-backend choices, in short (the measurements behind each are in the
handbook's design notes, docs/design.md, "Per-backend choices"):

- Convolution layout: CPU channels-last (XLA:CPU runs channels-first far
  slower inside the frame-batch scan); CUDA channels-first, the NCDHW
  layout XLA GPU keeps, with the resamplers made 3-D so nothing is
  transposed; ROCm channels-last (not measured); TPU left to XLA's layout
  assignment, resamplers 3-D.
- bf16 bias: CPU and CUDA add it in the fp32 accumulator and round once
  (CUDA through cuDNN's fused conv-bias epilogue, written as
  ``bf16 conv + bias``, `ConvPolicy.fused_bias`); TPU and ROCm add it
  after the bf16 rounding (the TPU compiler writes an fp32 epilogue out).
- fp16 is planned as bf16, except that every platform adds the bias in
  the fp32 accumulator. The fp16 TPU program is never compiled for a TPU.
- Convolution size: GPU and TPU split convolutions whose operand or result
  would reach 2^31 elements (cuDNN's speed; the TPU compiler's two copies
  of a padded input); the CPU never splits.
- TPU memory: SpatialNorm's scale and shift resized without a full-size
  gather, each causal conv's padded input behind the cache barrier, and
  the split above.
- Time taps (`patches.TimeTapCausalConv3d`): CPU in fp32 only.
- Time chunks (`patches.TimeChunkedResnetBlock3D`): CUDA only (on TPU they
  made the whole-chip program larger).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from jax.sharding import Mesh

from cogvideox_torchax.config import RuntimeOptions
from cogvideox_torchax.kernels.conv import ConvPolicy
from cogvideox_torchax.patches.registry import patches

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
_ALIASES = {"gpu": "cuda"}
GPU_PLATFORMS = ("cuda", "rocm")

# cuDNN convolutions with an operand or result of 2^31 elements or more.
GPU_MAX_CONV_ELEMENTS = 2**31 - 1
# TPU: the same size per device, for memory (the module docstring).
TPU_MAX_CONV_ELEMENTS = 2**31 - 1


def canonical_platform(platform: str) -> str:
    """``"cpu"``, ``"cuda"``, ``"rocm"`` or ``"tpu"`` (``"gpu"`` means CUDA).

    Raises:
        ValueError: for any other name.
    """
    name = _ALIASES.get(str(platform).lower(), str(platform).lower())
    if name not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)} (or gpu), got {platform!r}")
    return name


def mesh_platform(mesh: Mesh) -> str:
    """The platform of the mesh's devices, as `canonical_platform` names it."""
    device = mesh.devices.flat[0]
    if device.platform == "gpu":
        return "rocm" if "rocm" in str(getattr(device.client, "platform_version", "")).lower() else "cuda"
    return canonical_platform(device.platform)


@dataclasses.dataclass(frozen=True)
class Target:
    """What a program is built for: platform, dtype and mesh shape."""

    platform: str
    dtype: str
    dp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "platform", canonical_platform(self.platform))
        object.__setattr__(self, "dtype", RuntimeOptions(dtype=self.dtype).dtype)

    @classmethod
    def of(cls, mesh: Mesh, dtype: str, platform: str | None = None) -> Target:
        """The target of a program over ``mesh``, built for ``platform`` (default: the mesh's own)."""
        return cls(platform or mesh_platform(mesh), dtype, mesh.shape["dp"], mesh.shape["tp"])

    @property
    def is_gpu(self) -> bool:
        return self.platform in GPU_PLATFORMS


def conv_policy(target: Target, options: RuntimeOptions) -> ConvPolicy:
    """The `ConvPolicy` for ``target`` (see the module docstring for each choice)."""
    split = options.conv_split_elements
    if split is None and target.is_gpu:
        split = GPU_MAX_CONV_ELEMENTS
    elif split is None and target.platform == "tpu":
        # Per device: width sharding (tp) divides every activation.
        split = TPU_MAX_CONV_ELEMENTS * target.tp
    fused = target.platform == "cuda" and target.dtype != "float32"
    return ConvPolicy(
        channels_last=target.platform in ("cpu", "rocm"),
        # fp16 everywhere: the bias after rounding costs fp16 accuracy (module docstring).
        bias_in_fp32=target.dtype in ("float32", "float16") or target.platform == "cpu" or fused,
        fused_bias=fused,
        max_elements=split,
    )


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What runs for one target.

    Attributes:
        target: the platform, dtype and mesh shape the program is built for.
        steps: the `RuntimeOptions` switches applied, in order.
        skipped: ``(switch, why)`` for each switch left on auto that does
            not apply to this target.
        conv: the policy of every convolution (None without ``conv_bias``:
            torchax's own lowering).
    """

    target: Target
    steps: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    conv: ConvPolicy | None

    def applies(self, name: str) -> bool:
        """Whether the switch ``name`` is part of this plan."""
        return name in self.steps

    @property
    def conv_layout(self) -> str:
        """``"channels-last"``, ``"channels-first"`` (torchax's lowering) or ``"xla"`` (the backend's choice)."""
        if self.conv is None:
            return "channels-first"
        if self.applies("time_tap_conv"):
            return "channels-last, time taps"
        return "channels-last" if self.conv.channels_last else "xla"

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
            "target": dataclasses.asdict(self.target),
            "steps": list(self.steps),
            "skipped": dict(self.skipped),
            "conv": conv,
        }

    def __str__(self) -> str:
        t = self.target
        conv = "torchax convs"
        if self.conv is not None:
            bias = f"bias: {self._bias_words()}"
            split = "" if self.conv.max_elements is None else f", split above {self.conv.max_elements} elements"
            conv = f"convs {self.conv_layout}, {bias}{split}"
        return f"{t.platform} {t.dtype} dp={t.dp},tp={t.tp}: {', '.join(self.steps) or 'no patches'}; {conv}"


def build_plan(options: RuntimeOptions, target: Target) -> RunPlan:
    """Decides what runs for ``target`` under ``options``.

    Raises:
        ValueError: a switch set to True cannot apply to ``target``; the
            message says why.
    """
    applied: list[str] = []
    skipped: list[tuple[str, str]] = []
    for patch in patches():
        wanted = options.switch(patch.option)
        if wanted is False:
            continue
        why = patch.why_not(target, frozenset(applied))
        if why is None:
            applied.append(patch.option)
        elif wanted:
            raise ValueError(
                f"{patch.option}=True cannot apply on {target.platform} {target.dtype} "
                f"dp={target.dp},tp={target.tp}: {why}"
            )
        else:
            skipped.append((patch.option, why))
    conv = conv_policy(target, options) if "conv_bias" in applied else None
    return RunPlan(target, tuple(applied), tuple(skipped), conv)


def apply_plan(module: torch.nn.Module, plan: RunPlan, mesh: Mesh) -> None:
    """Patches ``module`` (in place) with every step of ``plan``.

    ``mesh`` places the sharding constraints; its shape must be the plan's.
    A patch without ``apply`` (``nearest_upsample``) acts while tracing
    (`patches.traced_environment`).
    """
    if (mesh.shape["dp"], mesh.shape["tp"]) != (plan.target.dp, plan.target.tp):
        raise ValueError(f"mesh {dict(mesh.shape)} does not match the plan's dp={plan.target.dp},tp={plan.target.tp}")
    for patch in patches():
        if patch.apply is not None and plan.applies(patch.option):
            patch.apply(module, plan, mesh)


def compiler_options(plan: RunPlan) -> dict[str, str] | None:
    """The XLA options the plan's program needs (its patches' `Patch.compiler_options`), or None."""
    options: dict[str, str] = {}
    for patch in patches():
        if plan.applies(patch.option):
            options.update(patch.compiler_options(plan.target) or {})
    return options or None

