"""Building and applying a `RunPlan`: the registered patches, the options' switches and the platform's profile.

`build_plan` walks a model family's patches in their order of application
(`cogvideox_torchax.patches.registry`) and keeps each whose switch is on, or
on auto where it applies: where its record's platforms take it,
the patch's own condition holds and what it requires was applied before
it. `apply_plan` patches a module with the result.
"""

from __future__ import annotations

from typing import Any

import torch
from jax.sharding import Mesh

from cogvideox_torchax import families
from cogvideox_torchax.kernels.conv import ConvPolicy
from cogvideox_torchax.options import RuntimeOptions
from cogvideox_torchax.patches.registry import patches, patches_for
from cogvideox_torchax.platforms.run_plan import Placement, RunPlan


def conv_policy(placement: Placement, options: RuntimeOptions) -> ConvPolicy:
    """The `ConvPolicy` of ``placement``'s profile, with ``options.conv_split_elements`` if set."""
    profile = placement.profile
    split = options.conv_split_elements
    if split is None and profile.max_conv_elements is not None:
        # Width sharding (tp) divides every activation.
        split = profile.max_conv_elements * (placement.tp if profile.split_per_device else 1)
    low = placement.dtype == "bfloat16"
    fused = profile.bias == "fused" and placement.dtype != "float32"
    return ConvPolicy(
        channels_last=profile.conv_layout == "channels-last",
        # fp16 everywhere: the bias after rounding costs fp16 accuracy.
        bias_in_fp32=not low or profile.bias != "after rounding",
        fused_bias=fused,
        max_elements=split,
    )


def why_not(patch, placement: Placement, applied: frozenset[str]) -> str | None:
    """Why ``patch`` does not apply to ``placement`` after ``applied`` (None: it applies)."""
    if patch.platforms is not None and placement.profile.name not in patch.platforms:
        return patch.platforms_why
    why = patch.why_not(placement, applied)
    if why is not None:
        return why
    missing = [name for name in patch.requires if name not in applied]
    return f"needs {', '.join(missing)}" if missing else None


def build_plan(options: RuntimeOptions, placement: Placement, family: str | None = None) -> RunPlan:
    """Decides what runs for a module of the model family ``family`` on ``placement`` under ``options``.

    ``family`` None is the default family's (a config naming no class).

    Raises:
        ValueError: a switch set to True cannot apply to ``placement``, or
            is another family's; the message says why.
    """
    family = family or families.DEFAULT.name
    own = patches_for(family)
    for patch in patches():
        if options.switch(patch.switch) and patch not in own:
            owners = ", ".join(families.get(f).title for f in patch.families or ())
            raise ValueError(f"{patch.switch}=True cannot apply to {families.get(family).title}: it patches {owners}")
    applied: list[str] = []
    skipped: list[tuple[str, str]] = []
    for patch in own:
        wanted = options.switch(patch.switch)
        if wanted is False:
            continue
        off = patch.opt_in(placement) if wanted is None and patch.opt_in is not None else None
        if off is not None:
            skipped.append((patch.switch, f"off unless set True: {off}"))
            continue
        why = why_not(patch, placement, frozenset(applied))
        if why is None:
            applied.append(patch.switch)
        elif wanted:
            p = placement
            raise ValueError(f"{patch.switch}=True cannot apply on {p.platform} {p.dtype} dp={p.dp},tp={p.tp}: {why}")
        else:
            skipped.append((patch.switch, why))
    conv = conv_policy(placement, options) if "conv_bias" in applied else None
    return RunPlan(placement, tuple(applied), tuple(skipped), conv, family)


def apply_plan(module: torch.nn.Module, plan: RunPlan, mesh: Mesh) -> None:
    """Patches ``module`` (in place) with every step of ``plan``.

    ``mesh`` places the sharding constraints; its shape must be the plan's.
    A patch without ``apply`` (``nearest_upsample``) acts while tracing
    (`patches.traced_environment`).
    """
    p = plan.placement
    if (mesh.shape["dp"], mesh.shape["tp"]) != (p.dp, p.tp):
        raise ValueError(f"mesh {dict(mesh.shape)} does not match the plan's dp={p.dp},tp={p.tp}")
    if families.of_module(module).name != plan.family:
        raise ValueError(f"a {families.of_module(module).title} module cannot take a plan for {plan.family}")
    for patch in patches_for(plan.family):
        if patch.apply is not None and plan.applies(patch.switch):
            patch.apply(module, plan, mesh)


def compiler_options(plan: RunPlan) -> dict[str, Any] | None:
    """The XLA options the plan's program needs (its platform's, its patches' `Patch.compiler_options`), or None."""
    options: dict[str, Any] = dict(plan.placement.profile.compiler_options)
    for patch in patches_for(plan.family):
        if plan.applies(patch.switch):
            options.update(patch.compiler_options(plan.placement) or {})
    return options or None
