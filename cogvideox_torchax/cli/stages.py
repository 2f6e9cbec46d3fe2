"""The commands' stages (load, compile, plan), each a progress bar on stderr and a time in the summary."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cogvideox_torchax.cli import agreement, errors, interrupts, options, out_of_memory, timeline


class Stage:
    """One progress bar per stage on stderr (nothing when quiet); times the stage (and records it on the `timeline`)."""

    def __init__(self, name: str, total: int, unit: str, quiet: bool):
        from tqdm import tqdm

        self.name = name
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
        timeline.record_stage(self.name, self._t0, end)
        self._bar.close()
        if exc_type is None:
            interrupts.check_interrupted()


def run_fields(vae, load: Stage) -> dict[str, Any]:
    """What every command's summary says of the run: dtype, mesh, processes, device, plan, load seconds."""
    import jax

    return {
        "model": vae.family.class_name,
        "dtype": vae.options.dtype,
        "mesh": dict(vae.mesh.shape),
        "processes": jax.process_count(),
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "plan": vae.plan.as_dict(),
        "load_s": round(load.seconds, 3),
    }


def compile_fields(seconds: float, cache_dir: Any, status: str) -> dict[str, Any]:
    """The summary's compile seconds and JAX compile cache: ``status`` (as the run saw it), ``"off"`` without a cache."""
    return {
        "compile_s": round(seconds, 3),
        "compile_cache": status if cache_dir else "off",
        "compile_cache_dir": str(cache_dir) if cache_dir else None,
    }


def load_together(run: options.RunOptions):
    """The compile cache and the "load" stage on every process (`agreement.together`). Returns ``(cache_dir, vae, stage)``.

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
    import jax

    from cogvideox_torchax.memory import in_use

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


def compile_stage(compile_for: Callable[[tuple[int, ...]], Any], shape: tuple[int, ...], run: options.RunOptions):
    """The "compile" stage: ``compile_for(shape)``, counting cache hits. Returns ``(stage, cache_events)``."""
    from cogvideox_torchax.memory import in_use
    from cogvideox_torchax.vae import compile_cache

    with Stage("compile", 1, "program", run.quiet) as stage:
        with compile_cache.count_cache_events() as cache_events:
            compile_for(tuple(shape))
        stage.tick()
    if run.memory_report:
        in_use.report("compile")
    return stage, cache_events


def plan_stage(
    vae, shape: tuple[int, ...], kind: str, run: options.RunOptions, load: Stage, plan_with: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """``--dry-run``'s "plan" stage: the memory plan of ``shape`` (compiled, not run) and its summary fields.

    ``plan_with()`` makes the plan instead of `TorchaxVAE.memory_plan` (the
    streamed decode's); it returns None when that way does not fit, and the
    memory plan is made then.
    """
    target = run.model.target
    with agreement.together("planning"), out_of_memory.out_of_memory_as_exit_3(f"planning the {kind} of", shape):
        with Stage("plan", 1, "shape", run.quiet) as stage:
            plan = plan_with() if plan_with is not None else None
            if plan is None:
                plan = vae.memory_plan(tuple(shape), kind=kind, target=target, mesh=run.model.mesh if target else None)
            stage.tick()
    summary = {"dry_run": True, **run_fields(vae, load), "memory_plan": plan.as_dict(), "plan_s": round(stage.seconds, 3)}
    if target is not None:
        summary.update(target_report(vae, tuple(shape), kind, target, plan))
    return summary


def print_target(s: dict[str, Any]) -> None:
    """The human lines of `target_report`'s fields (nothing without ``--target``)."""
    if "target" not in s:
        return
    b, c = s["per_device_bytes"], s["compiled"]
    extra = s["memory_plan"].get("allowance") or 0
    print(f"  target {s['target']['name']} ({s['target']['description']}), compiled by its own compiler: "
          f"temp {b['temp'] / 2**30:.2f} GiB, arguments {b['arguments'] / 2**30:.2f} GiB, "
          f"outputs {b['outputs'] / 2**30:.2f} GiB per device"
          + (f"; the plan adds {extra / 2**30:.2f} GiB for the cuDNN workspaces autotuning picks on the device"
             if extra else ""))
    print(f"  {c['convolutions']} convolutions {c['conv_layouts']} -> {c['conv_output_dtypes']}; "
          f"activations moved to another layout {c['activation_layout_changes']} ({c['layout_changes']} moves in all), "
          f"copied {c['activation_copies']} ({c['copies']}); collectives {c['collectives'] or 'none'}; planning (trace, lower and compile of each plan tried) {s['plan_s']:.2f} s")


def target_report(vae, shape: tuple[int, ...], kind: str, target: str, plan) -> dict[str, Any]:
    """What ``--dry-run --target`` adds: the target, its program's plan, bytes per device, HLO counts.

    The compile time is the plan stage's (``plan_s``).
    """
    from cogvideox_torchax.platforms import accelerators, hlo

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
