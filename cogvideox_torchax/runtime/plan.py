"""What runs on a target: the patches and convolution policy for one platform, dtype and mesh.

A `RunPlan` is data: which optimisations apply (in the order they are
applied), which switches of `RuntimeOptions` were left out and why, and the
`kernels.conv.ConvPolicy` every convolution runs with. `build_plan` makes it
from the options and a `Target`; `apply_plan` patches a module with it. The
target is the platform the program is *built for*, not the machine Python
runs on, so a CUDA or TPU program can be built and inspected on a CPU.

Per-backend choices and why:

- Convolution layout. CPU: channels-last; inside the frame-batch scan
  XLA:CPU runs a channels-first convolution ~40x slower (see
  `kernels.conv`). CUDA: written channels-first, the layout the compiler
  keeps: XLA GPU lays every 3-D convolution out NCDHW whatever the program
  says (compiled for an H200, `cogvideox_torchax.runtime.targets`), and with the
  resamplers' 2-D convolutions made 3-D (``resample_conv3d``) every
  convolution is NCDHW and no activation is transposed (2b decode at
  (1,16,13,60,90): none, against 36 transposes and 37 copies with
  channels-last convs and 2-D upsamplers). ROCm: channels-last (not
  measured). TPU: left to XLA, whose TPU layout assignment picks the
  physical layout of every operand whatever the logical one; the 3-D
  resamplers lower what the TPU compiler asks for the CogVideoX 1.5
  headline on one v6e chip from 54.54 to 42.19 GiB (then see TPU memory).
- bf16 bias. CPU: added in the fp32 accumulator, rounded once (XLA:CPU
  fuses that epilogue; +0.5 dB against torchax's two roundings). CUDA: the
  same numbers from cuDNN's conv-bias epilogue, which XLA fuses from
  ``bf16 conv + bias`` (written that way for CUDA only, `ConvPolicy.fused_bias`;
  the explicit fp32 form made cuDNN write the fp32 accumulator out: 78 ms
  vs 35 ms for a bf16 256->128 3x3x3 conv at 768x1360, H100).
  TPU and ROCm: the convolution emits bf16 and the bias is added after.
  The TPU compiler does not keep an fp32 epilogue in the accumulator:
  compiled for one v6e chip with the bias in fp32 (tiny config,
  (1,4,3,16,16)), every convolution fusion writes fp32 out (67 of 67;
  with the bias after rounding only SpatialNorm's 42 latent-size 1x1x1s
  do) and the temporaries grow 8.07 -> 57.49 MiB. The accuracy is
  checked against upstream torch's own bf16 decode
  (tests/test_accelerator_programs.py).
- fp16 (float16) is planned as bf16 everywhere (fp32 GroupNorm statistics,
  SiLU and SpatialNorm's scale and shift in fp32, one rounding per op, no
  activation-sized fp32 tensor, the same layouts and splits, no time
  taps), except the bias: on every platform it goes into the fp32
  accumulator, rounded once. CPU: as bf16. CUDA: as bf16, cuDNN's fp16
  conv-bias epilogue (fp32 accumulation, fused from ``fp16 conv + bias``).
  TPU and ROCm: the explicit fp32 form (``preferred_element_type=f32``,
  bias, one cast), not the bf16 plan's add after rounding, which in fp16
  left the TPU plan's encode up to 1.20 dB below upstream torch's own fp16
  encode against fp32 (tiny config, (1,3,9,128,128), seeds 0-5: -1.20 to
  +0.19 dB; with the bias in fp32 -0.32 to +0.21 dB, as the CPU plan).
  TPUs have bf16, not fp16, matrix units; how the TPU compiler runs an fp16
  program (its memory, its speed) is not measured here: the fp16 TPU
  program is lowered and run on the CPU, never compiled for a TPU.
  Accuracy: tests/test_parity.py, tests/test_encode.py.
- Convolution size. GPU: no convolution operand or result of 2^31 elements
  or more; cuDNN's kernels at that size took 17.6 s where two halves took
  70 ms (H100). TPU: the same limit per device, for memory: the TPU
  compiler stores a convolution's padded input twice (in the elementwise
  layout and relayouted for the convolution), 2 x 5.51 GiB for the 1.5
  headline's first 256 -> 128 conv at 768x1360. CPU: never split.
- TPU memory (CogVideoX 1.5 headline, one v6e chip, what the compiler
  asks: 42.19 -> 21.33 GiB): SpatialNorm's scale and shift resized without
  a full-size gather (``LowResSpatialNorm3D.block_broadcast``), the padded
  input of each causal conv behind the cache barrier (as on CUDA) and the
  convolution split above.
- Time taps (`patches.TimeTapCausalConv3d`): CPU in fp32 only.
- Time chunks (`patches.TimeChunkedResnetBlock3D`): CUDA. Compiled for an
  H200 (bf16): 1.5 at (1,16,21,96,170) 20.40 -> 15.61 GiB, 2b at
  (1,16,13,60,90) 6.44 -> 5.80 GiB of temporaries, no layout changes.
  Not on TPU: at `tp=8` (v6e-8, 1.5 headline) chunks forced through an
  upstream-order norm (a trial, not kept) moved the compiler's smallest
  heap only from 3.57 to 3.34 GiB per chip, and compiled with the whole
  chip took 6.47 GiB against 5.33 without.
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

