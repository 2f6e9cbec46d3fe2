"""The commands' stages (load, compile, plan), each a progress bar on stderr and a time in the summary."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from cogvideox_torchax.cli import agreement, errors, interrupts, options, out_of_memory, plans, timeline
from cogvideox_torchax.memory import in_use
from cogvideox_torchax.platforms import accelerators, hlo


class Stage:
    """One progress bar per stage on stderr (nothing when quiet); times the stage (and records it on the `timeline`)."""

    def __init__(self, name: str, total: int, unit: str, quiet: bool, record: bool = True):
        self.name, self._record = name, record
        self._bar = tqdm(total=total, desc=f"{name:<8}", unit=unit, disable=quiet, file=errors.STDERR, leave=True)
        self._t0 = time.perf_counter()
        self.seconds = 0.0

    def tick(self, n: int = 1) -> None:
        self._bar.update(n)

    def write(self, text: str) -> None:
        """One line on stderr above the bar (shown even when quiet: it reports a failure)."""
        self._bar.write(text, file=errors.STDERR)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        end = time.perf_counter()
        self.seconds = end - self._t0
        if self._record:
            timeline.record_stage(self.name, self._t0, end)
        self._bar.close()
        if exc_type is None:
            interrupts.check_interrupted()


def load_together(run: options.RunOptions):
    """The compile cache and the "load" stage on every process (`agreement.together`): ``(cache_dir, vae, stage)``.

    Under jax.distributed the processes then agree on the memory budget
    (a collective, so here rather than at the first plan inside a step).
    """
    with agreement.together("loading the model"):
        cache_dir = options.compile_cache_from(run)
        vae, stage = load_stage(run)
    if agreement.process_count() > 1:
        vae.memory_budget()
    return cache_dir, vae, stage


def load_stage(run: options.RunOptions):
    """The "load" stage: the model on its devices. Returns ``(vae, stage)``."""
    import jax  # about 1 s: only once the options are checked (bad ones are refused in milliseconds)

    with Stage("load", 1, "model", run.quiet) as stage:
        vae = options.load_model(run.model)
        for name, start, end in vae.programs.load_times:  # checks, weights, wrap
            timeline.record_part(name, start, end)
        with timeline.timed_part("weights"):
            jax.block_until_ready(vae.weights)
        stage.tick()
    if run.memory_report:
        in_use.report("load")
    return vae, stage


def compile_stage(compile_for: Callable[[tuple[int, ...]], Any], shape: tuple[int, ...], run: options.RunOptions,
                  shown: bool = True):
    """The "compile" stage: ``compile_for(shape)``, counting cache hits. Returns ``(stage, cache_events)``.

    Not ``shown``: no bar (a many-latents run's shapes compile under its decode bar), a part of the timeline.
    """
    from cogvideox_torchax.vae import compile_cache  # imports JAX: not before the options are checked

    with Stage("compile", 1, "program", run.quiet or not shown, record=shown) as stage:
        with timeline.timed_part("compile") if not shown else contextlib.nullcontext():
            with compile_cache.count_cache_events() as cache_events:
                compile_for(tuple(shape))
        stage.tick()
    if run.memory_report:
        in_use.report("compile")
    return stage, cache_events


def plan_stage(vae, shape: tuple[int, ...], kind: str, run: options.RunOptions,
               choose: Callable[[], plans.ShapePlan] | None = None):
    """``--dry-run``'s "plan" stage: the stream's plan where ``choose()`` gives one, else the memory plan of ``kind``.

    Compiled, not run. Returns ``(plan, shape_plan, stage)``.
    """
    target = run.model.target
    with agreement.together("planning"), out_of_memory.out_of_memory_as_exit_3(f"planning the {kind} of", shape):
        with Stage("plan", 1, "shape", run.quiet) as stage:
            chosen = choose() if choose is not None else plans.ShapePlan(tuple(shape), kind, None, None)
            plan = chosen.streamed or vae.memory_plan(tuple(shape), kind=chosen.program, target=target,
                                                      mesh=run.model.mesh if target else None)
            stage.tick()
    return plan, chosen, stage


def target_report(vae, shape: tuple[int, ...], kind: str, target: str, plan) -> dict[str, Any]:
    """What ``--dry-run --target`` adds: the target, its program's plan, bytes per device, HLO counts.

    The compile time is the plan stage's (``plan_s``).
    """
    acc = accelerators.get(target)
    mesh = f"dp={plan.mesh[0]},tp={plan.mesh[1]}"
    # The plan's own executable (compiled while planning; not compiled again).
    compiled = (vae.compile_encode(shape, target=target, mesh=mesh) if kind == "encode"
                else vae.compile_decode(shape, target=target, mesh=mesh))
    m = compiled.memory_analysis()
    program = vae.plan_for(acc.platform)
    return {
        "target": {"name": acc.name, "platform": acc.platform, "devices": acc.devices, "budget": acc.budget,
                   "autotune_allowance": acc.autotune_allowance, "description": acc.description},
        "mesh": {"dp": plan.mesh[0], "tp": plan.mesh[1]},
        "plan": program.as_dict(),
        "per_device_bytes": {"temp": int(m.temp_size_in_bytes), "arguments": int(m.argument_size_in_bytes),
                             "outputs": int(m.output_size_in_bytes)},
        "compiled": hlo.compiled_summary(compiled.as_text()),
    }
