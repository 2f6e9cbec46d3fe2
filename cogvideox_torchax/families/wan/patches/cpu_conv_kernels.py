"""Wan's time-tap programs compiled with jax 0.10's XLA:CPU's YNNPACK fusions off, so XLA's own kernels convolve.

jax 0.10.2's XLA:CPU hands each 2-D convolution, with the elementwise work
around it, to YNNPACK; on the project's 2-core CPU its own (Eigen) kernels
run the time taps' channels-last 3x3 convolutions faster in fp32, and the
decode with them. jax 0.12's YNNPACK fusions are the faster, so from jax
0.11 on (0.11 not measured) the program keeps XLA's defaults. The option is
one per compile (`Patch.compiler_options`): CogVideoX's programs and anyone
else's are compiled as before. It needs the time taps: without them the
convolutions are 3-D, which it was not measured on.
Measurements: docs/results/wan-cpu-2026-11-28.md.
"""

from __future__ import annotations

import jax

from cogvideox_torchax.patches.base import Patch

# XLA:CPU's list of op kinds it fuses into YNNPACK calls; empty: none.
NO_YNN_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def _options(placement) -> dict[str, str]:
    return dict(NO_YNN_FUSIONS)


# The newest jax whose XLA:CPU was measured faster with the fusions off.
LAST_MEASURED_FASTER = (0, 10)


def _why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.platform != "cpu":  # XLA's other compilers refuse an option they do not know
        return "an XLA:CPU option"
    if tuple(jax.__version_info__[:2]) > LAST_MEASURED_FASTER:
        return f"jax {jax.__version__}: YNNPACK's fusions measured faster on jax 0.12 (0.11 not measured)"
    return None


PATCHES = (
    Patch(
        "wan_cpu_conv_kernels", "layers",
        "Compile Wan's time-tap programs with XLA:CPU's YNNPACK fusions off "
        "(`xla_cpu_experimental_ynn_fusion_type` empty), so XLA's own kernels run the 2-D convolutions: "
        "faster on the 2-core CPU measured (docs/results/wan-cpu-2026-11-28.md). CPU, fp32 and jax 0.10 only "
        "(jax 0.12's YNNPACK fusions are the faster), with `wan_time_taps`.",
        None,
        families=("wan",),
        requires=("wan_time_taps",),
        why_not=_why_not,
        compiler_options=_options,
    ),
)
