"""What the ``decode`` and ``encode`` commands share: model options, stages, errors.

Both are thin command lines over the library with the same rules: progress
bars per stage on stderr, a summary (or ``--json``) on stdout, and the exit
codes of `EXIT_CODES`: every failure is one line on stderr (``--debug`` for
the traceback) and leaves no output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RANDOM_PREFIX = "random:"

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_OUT_OF_MEMORY, EXIT_SOME_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = """exit codes:
  0    success: every output was written (or, with --skip-existing, was there already)
  1    an error of this tool or the system (e.g. a disk filling up while writing, a jax.distributed
       cluster that did not start within --distributed-timeout); nothing written
  2    bad input or a refused output (unreadable or out-of-range latents/video, broken model
       folder or config, an output that exists or may not be replaced, an unwritable folder,
       a decode that would produce NaN/Inf); nothing written, checked before decoding
       wherever it can be
  3    out of memory: no plan fits --max-memory (checked from compiled programs before running),
       or the device ran out while compiling or running (the message names the shape); nothing written
  4    decoding many latents (--output-dir): some inputs failed, each named on stderr; the outputs
       of all the others were written (with --dry-run: some inputs cannot be decoded)
  130  interrupted (Ctrl-C); nothing written (with --output-dir: the outputs already complete stay)

Under jax.distributed every process exits with the same code; only process 0 reads inputs, writes
outputs and prints the summary. A process that dies ends the others within the heartbeat timeout
(JAX's coordination service; exit code 134).

--overwrite replaces an existing file, or a folder holding nothing but frame_*.png files;
anything else is refused with exit code 2. Outputs appear only when all are complete."""


class UsageError(Exception):
    """Bad input; reported as one line with exit code 2."""


class OutOfMemory(Exception):
    """The compile or the run needs more memory than there is; reported as one line with exit code 3."""


class PeerFailed(Exception):
    """A process of a jax.distributed run failed a step; every process leaves with the same exit code.

    ``own`` is this process's own error when it failed too, with another code
    than the one agreed (printed as well; the others' logs say theirs).
    """

    def __init__(self, code: int, text: str, own: BaseException | None = None):
        super().__init__(text)
        self.code = code
        self.own = own


def agreed_code(codes: list[int]) -> int:
    """The one exit code of a step from every process's code: an interrupt wins, else the first failure."""
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    return next((c for c in codes if c != EXIT_OK), EXIT_OK)


def _peer_failed(codes: list[int], what: str, own: BaseException | None = None) -> PeerFailed:
    code = agreed_code(codes)
    i = codes.index(code)
    return PeerFailed(code, f"process {i} of the jax.distributed run failed {what} (exit {code}); see its log", own)


def _gather_codes(code: int) -> list[int]:
    if _process_count() == 1:
        return [code]
    from cogvideox_torchax import distributed

    return distributed.gather_codes(code)


def add_distributed_arguments(p: argparse.ArgumentParser) -> None:
    """The options that run a command as one process of a jax.distributed cluster."""
    g = p.add_argument_group(
        "several processes (jax.distributed; run the same command in every process)",
        "The mesh then spans every process's devices (default: dp across processes, tp inside one).",
    )
    g.add_argument(
        "--distributed",
        action="store_true",
        help="join the cluster JAX detects (TPU pod slice, SLURM, Open MPI)",
    )
    g.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address, the same for every process")
    g.add_argument("--num-processes", type=int, metavar="N", help="how many processes take part")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 .. N-1")
    g.add_argument(
        "--distributed-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait for every process to join (default 300), then exit 1 with one line",
    )


def start_distributed(args: argparse.Namespace) -> None:
    """Joins the cluster the options name, if any; non-primary processes go quiet (no bars, no summary)."""
    explicit = [args.coordinator, args.num_processes, args.process_id]
    if not args.distributed and all(v is None for v in explicit):
        return
    from cogvideox_torchax import distributed

    try:
        if args.distributed and all(v is None for v in explicit):
            distributed.initialize_distributed(timeout_s=args.distributed_timeout)
        else:
            distributed.initialize_distributed(*explicit, timeout_s=args.distributed_timeout)
    except distributed.DistributedError as e:
        raise UsageError(str(e)) from e
    if not distributed.is_primary():
        args.quiet, args.json = True, False


def _process_count() -> int:
    # Asks JAX only when jax.distributed has been started (importing JAX is
    # slow, and a one-process run need not).
    if "jax" not in sys.modules:
        return 1
    from cogvideox_torchax import distributed

    return distributed.process_count() if distributed.is_initialized() else 1


def is_primary() -> bool:
    """Whether this process reads, writes and prints (always, unless a non-zero jax.distributed process)."""
    if _process_count() == 1:
        return True
    from cogvideox_torchax import distributed

    return distributed.is_primary()


@contextlib.contextmanager
def together(what: str) -> Iterator[None]:
    """A step after which every process of a jax.distributed run goes on, or every one fails with one code.

    Inside, code may fail on one process only (process 0's reading, a host's
    model load); each process then reports its exit code to the others, and
    every process leaves with the code of `agreed_code` (an interrupt
    anywhere, else the first failing process's): its own exception if the
    codes match, else `PeerFailed`. Collectives (gathers, shares) belong
    outside: a process that failed early would meet the others' gather with
    its report. With one process it does nothing.
    """
    if _process_count() == 1:
        yield
        return
    try:
        yield
    except BaseException as e:
        _settle(None, e, what)
        raise  # not reached: an exception's code is never EXIT_OK
    _settle(None, None, what)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model, runtime and reporting options both commands take."""
    p.add_argument(
        "--model",
        default="THUDM/CogVideoX-2b",
        help=f"local diffusers folder, hub id, or {RANDOM_PREFIX}cogvideox-2b / {RANDOM_PREFIX}cogvideox-5b / "
        f"{RANDOM_PREFIX}cogvideox-1.5 / {RANDOM_PREFIX}tiny (seeded random weights, no download); "
        "default THUDM/CogVideoX-2b",
    )
    p.add_argument("--subfolder", default=None, help="VAE folder inside --model (default 'vae' for hub ids)")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16 (fp32/bf16)")
    p.add_argument("--mesh", default=None, help="device mesh, e.g. dp=1,tp=8 (default: all devices on tp)")
    p.add_argument("--seed", type=int, default=0, help=f"seed for {RANDOM_PREFIX} models")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Output, cache and reporting options both commands take."""
    p.add_argument("--compile-cache", default=None, metavar="DIR", help="persistent compilation cache folder")
    p.add_argument("--no-compile-cache", action="store_true", help="do not read or write the compilation cache")
    p.add_argument(
        "--memory-report",
        action="store_true",
        help="print live device memory after each stage (also $COGVIDEOX_TORCHAX_MEMORY_REPORT=1)",
    )
    p.add_argument(
        "--max-memory",
        default="auto",
        metavar="auto|SIZE",
        help="per-device memory the run must fit, e.g. 16GiB (default auto: the device's capacity); "
        "the plan (whole, or upstream's tiling with more tiles) is chosen from compiled programs before running",
    )
    p.add_argument("--dry-run", action="store_true", help="print the memory plan and its compiled bytes; run nothing")
    p.add_argument(
        "--target",
        default=None,
        metavar="NAME",
        help="with --dry-run: plan for an accelerator that is not here (h100, h200, v5e-1, v5e-8, v6e-1, v6e-8) "
        "with its real compiler (the aot extra); --mesh is then the target's mesh, --max-memory its budget",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars and no summary")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def check_max_memory(args: argparse.Namespace) -> None:
    """Refuses a ``--max-memory`` that is neither ``auto`` nor a size, and a bad ``--target`` (exit 2, before loading)."""
    from cogvideox_torchax import budget, targets

    try:
        budget.parse_memory(args.max_memory)
    except ValueError as e:
        raise UsageError(f"--max-memory: {e}") from e
    if args.target is None:
        return
    if not args.dry_run:
        raise UsageError("--target plans for an accelerator that is not here: it needs --dry-run")
    try:
        targets.target_mesh(args.target, args.mesh)
    except (ValueError, targets.TargetUnavailableError) as e:
        raise UsageError(f"--target: {e}") from e


def check_dtype(args: argparse.Namespace) -> None:
    from cogvideox_torchax.config import canonical_dtype

    try:
        canonical_dtype(args.dtype)
    except ValueError as e:
        raise UsageError(str(e)) from e


_warned: set[str] = set()


def warn_once(text: str, quiet: bool = False) -> None:
    """One ``warning:`` line on stderr, once per process (nothing when quiet)."""
    if text not in _warned and not quiet:
        print(f"warning: {text}", file=sys.stderr)
    _warned.add(text)


def compile_cache_from_args(args: argparse.Namespace) -> Path | None:
    """Turns the persistent compile cache on (returns its folder) or off (None) as the options say.

    A ``--compile-cache`` folder that cannot be created or written is bad
    input; a default folder that cannot (e.g. a home that is not writable)
    is a warning, and the run goes on without the cache.
    """
    from cogvideox_torchax import compile_cache

    if args.no_compile_cache:
        compile_cache.disable_compile_cache()
        return None
    try:
        return compile_cache.enable_compile_cache(args.compile_cache)
    except OSError as e:
        if args.compile_cache is not None:
            raise UsageError(
                f"compile cache folder {e.strerror}; pass another --compile-cache or --no-compile-cache"
            ) from e
        warn_once(f"cannot use the default compile cache {e.strerror}; running without it", args.quiet)
        compile_cache.disable_compile_cache()
        return None


def load_model(args: argparse.Namespace):
    """The `TorchaxVAE` that ``--model`` / ``--subfolder`` / ``--dtype`` / ``--mesh`` / ``--seed`` name."""
    import cogvideox_torchax as ct

    if getattr(args, "target", None) is not None:
        # --mesh is the target's; the weights stay on one local device.
        args = argparse.Namespace(**{**vars(args), "mesh": "dp=1,tp=1"})
    if args.model.startswith(RANDOM_PREFIX):
        preset = args.model[len(RANDOM_PREFIX) :]
        try:
            module = ct.random_upstream(preset, seed=args.seed)
        except ValueError as e:
            raise UsageError(str(e)) from e
        return ct.wrap(module, dtype=args.dtype, mesh=args.mesh, max_memory=args.max_memory)
    subfolder = args.subfolder
    if subfolder is None and not Path(args.model).exists():
        subfolder = "vae"
    return ct.from_pretrained(
        args.model, subfolder=subfolder, dtype=args.dtype, mesh=args.mesh, max_memory=args.max_memory
    )


_interrupted = False


def _on_sigint(signum: int, frame: object) -> None:
    # Python raises KeyboardInterrupt in whatever Python code runs next,
    # which can be a garbage-collection callback that swallows it ("Exception
    # ignored in ..."); the flag makes the next check_interrupted() see it.
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def _unraisable(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    def hook(info: Any) -> None:
        global _interrupted
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            _interrupted = True  # swallowed by a callback: no traceback, seen at the next check
            return
        previous(info)

    return hook


def check_interrupted() -> None:
    """Raises KeyboardInterrupt if Ctrl-C was pressed during this command, even if the interrupt was swallowed."""
    if _interrupted:
        raise KeyboardInterrupt


class Stage:
    """One progress bar per stage on stderr (nothing when quiet); times the stage."""

    def __init__(self, name: str, total: int, unit: str, quiet: bool):
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=f"{name:<8}", unit=unit, disable=quiet, file=sys.stderr, leave=True)
        self._t0 = time.perf_counter()
        self.seconds = 0.0

    def tick(self, n: int = 1) -> None:
        self._bar.update(n)

    def write(self, text: str) -> None:
        """One line on stderr above the bar (shown even when quiet: it reports a failure)."""
        self._bar.write(text, file=sys.stderr)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._bar.close()
        if exc_type is None:
            check_interrupted()


def load_together(args: argparse.Namespace, show_memory: bool):
    """The compile cache and the "load" stage on every process (`together`). Returns ``(cache_dir, vae, stage)``.

    Under jax.distributed the processes then agree on the memory budget
    (a collective, so here rather than at the first plan inside a step).
    """
    with together("loading the model"):
        cache_dir = compile_cache_from_args(args)
        vae, stage = load_stage(args, show_memory)
    if _process_count() > 1:
        vae.memory_budget()
    return cache_dir, vae, stage


def load_stage(args: argparse.Namespace, show_memory: bool):
    """The "load" stage: the model on its devices. Returns ``(vae, stage)``."""
    import jax

    from cogvideox_torchax import memory

    with Stage("load", 1, "model", args.quiet) as stage:
        vae = load_model(args)
        jax.block_until_ready(vae.weights)
        stage.tick()
    if show_memory:
        memory.report("load")
    return vae, stage


def compile_stage(compile_for: Callable[[tuple[int, ...]], Any], shape: tuple[int, ...], args, show_memory: bool):
    """The "compile" stage: ``compile_for(shape)``, counting cache hits. Returns ``(stage, cache_events)``."""
    from cogvideox_torchax import compile_cache, memory

    with Stage("compile", 1, "program", args.quiet) as stage:
        with compile_cache.count_cache_events() as cache_events:
            compile_for(tuple(shape))
        stage.tick()
    if show_memory:
        memory.report("compile")
    return stage, cache_events


def plan_stage(vae, shape: tuple[int, ...], kind: str, args: argparse.Namespace, load: Stage) -> dict[str, Any]:
    """``--dry-run``'s "plan" stage: the memory plan of ``shape`` (compiled, not run) and its summary fields."""
    target = getattr(args, "target", None)
    with together("planning"), out_of_memory_as_exit_3(f"planning the {kind} of", shape):
        with Stage("plan", 1, "shape", args.quiet) as stage:
            plan = vae.memory_plan(tuple(shape), kind=kind, target=target, mesh=args.mesh if target else None)
            stage.tick()
    summary = {
        "dry_run": True,
        "dtype": vae.options.dtype,
        "mesh": dict(vae.mesh.shape),
        "plan": vae.plan.as_dict(),
        "memory_plan": plan.as_dict(),
        "load_s": round(load.seconds, 3),
        "plan_s": round(stage.seconds, 3),
    }
    if target is not None:
        summary.update(target_report(vae, tuple(shape), kind, target, plan))
    return summary


def print_target(s: dict[str, Any]) -> None:
    """The human lines of `target_report`'s fields (nothing without ``--target``)."""
    if "target" not in s:
        return
    b, c = s["per_device_bytes"], s["compiled"]
    print(f"  target {s['target']['name']} ({s['target']['description']}), compiled by its own compiler: "
          f"temp {b['temp'] / 2**30:.2f} GiB, arguments {b['arguments'] / 2**30:.2f} GiB, "
          f"outputs {b['outputs'] / 2**30:.2f} GiB per device")
    print(f"  {c['convolutions']} convolutions {c['conv_layouts']} -> {c['conv_output_dtypes']}; "
          f"activations moved to another layout {c['activation_layout_changes']} ({c['layout_changes']} moves in all), "
          f"copied {c['activation_copies']} ({c['copies']}); collectives {c['collectives'] or 'none'}; planning (trace, lower and compile of each plan tried) {s['plan_s']:.2f} s")


def target_report(vae, shape: tuple[int, ...], kind: str, target: str, plan) -> dict[str, Any]:
    """What ``--dry-run --target`` adds: the target, its program's plan, bytes per device, HLO counts.

    The compile time is the plan stage's (``plan_s``).
    """
    from cogvideox_torchax import hlo, targets

    acc = targets.get(target)
    mesh = f"dp={plan.mesh[0]},tp={plan.mesh[1]}"
    # The plan's own executable (compiled while planning; not compiled again).
    compiled = (vae.compile_encode(shape, target=target, mesh=mesh) if kind == "encode"
                else vae.compile_decode(shape, target=target, mesh=mesh))
    m = compiled.memory_analysis()
    program = vae.plan_for(acc.platform)
    return {
        "target": {"name": acc.name, "platform": acc.platform, "devices": acc.devices, "budget": acc.budget,
                   "description": acc.description},
        "mesh": {"dp": plan.mesh[0], "tp": plan.mesh[1]},
        "plan": program.as_dict(),
        "per_device_bytes": {"temp": int(m.temp_size_in_bytes), "arguments": int(m.argument_size_in_bytes),
                             "outputs": int(m.output_size_in_bytes)},
        "compiled": hlo.compiled_summary(compiled.as_text()),
    }


def _is_out_of_memory(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    if isinstance(e, (UsageError, ValueError)):
        return False
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


_ASKED = re.compile(r"allocat\w*\s+([\d.]+\s*[KMGT]?i?B|\d+\s*bytes)", re.I)


@contextlib.contextmanager
def out_of_memory_as_exit_3(what: str, shape: tuple[int, ...], vae=None, kind: str | None = None) -> Iterator[None]:
    """Turns XLA's RESOURCE_EXHAUSTED / out-of-memory errors (and MemoryError) inside the block into `OutOfMemory`.

    The message names the shape, the bytes asked (from XLA's message) and
    the plan's bytes and budget; with the program ``kind`` (``"decode"``,
    ``"frames"``, ``"encode"``) also the ``--max-memory`` that would choose
    the next smaller plan, or that none exists.
    """
    try:
        yield
    except Exception as e:
        if not _is_out_of_memory(e):
            raise
        raise OutOfMemory(_out_of_memory_line(e, what, shape, vae, kind)) from e


def _out_of_memory_line(e: BaseException, what: str, shape: tuple[int, ...], vae, kind: str | None) -> str:
    from cogvideox_torchax import budget

    shape = tuple(int(v) for v in shape)
    where = f" ({vae.options.dtype}, mesh {dict(vae.mesh.shape)})" if vae is not None else ""
    asked = _ASKED.search(str(e))
    first = " ".join(str(e).split("\n")[0].split())[:200] or type(e).__name__
    line = f"out of memory {what} shape {shape}{where}: " + (f"asked {asked.group(1)}" if asked else first)
    kinds = [kind] if kind else ["decode", "frames", "encode"]
    plans = [] if vae is None else [vae.planned(shape, kind=k) for k in kinds]
    plan = next((p for p in plans if p is not None), None)
    if plan is not None:
        line += f"; the plan ({plan.name}) compiled to {budget.human(plan.bytes)} per device"
        line += f" of {budget.human(plan.budget)} usable" if plan.budget else ""
        if kind is not None:  # asked for the hint: plans the next one (this run is over)
            try:
                # Planned, not chosen: a many-latents run goes on with its plans as they were.
                smaller = vae.next_plan(shape, kind=kind, choose=False)
            except budget.MemoryBudgetError:
                return line + "; no smaller plan exists: try --dtype bfloat16 or a mesh with more devices on tp"
            except Exception:  # the hint is a courtesy; the line stands without it
                smaller = None
            if smaller is not None:
                flag = _size_flag(smaller.bytes / (1 - budget.SAFETY_MARGIN))
                return line + f"; --max-memory {flag} would run the {smaller.name} plan ({budget.human(smaller.bytes)})"
    return line + "; try a --max-memory below what the device really has free (tiling follows), --dtype bfloat16, or a larger --mesh"


def _size_flag(n: float) -> str:
    """A ``--max-memory`` value of at least ``n`` bytes, rounded up: ``12.35GiB`` or ``831MiB``."""
    if n >= 2**30:
        return f"{math.ceil(n / 2**30 * 100) / 100:.2f}GiB"
    return f"{math.ceil(n / 2**20)}MiB"


def _attempt(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except BaseException as e:  # reported to the other processes before anyone leaves
        return None, e


def _settle(result: Any, error: BaseException | None, what: str) -> Any:
    """``result`` if every process succeeded, else raises with the agreed code (a collective when distributed)."""
    codes = _gather_codes(EXIT_OK if error is None else exit_code(error))
    if agreed_code(codes) == EXIT_OK:
        return result
    _raise_agreed(codes, error, what)


def _raise_agreed(codes: list[int], error: BaseException | None, what: str) -> None:
    """Raises this process's own ``error`` if its code is the agreed one, else `PeerFailed` with that code."""
    if error is not None and exit_code(error) == agreed_code(codes):
        raise error
    raise _peer_failed(codes, what, own=error)


def retry_out_of_memory(args: argparse.Namespace, vae, shape: tuple[int, ...], kind: str, what: str, run: Callable[[], Any]) -> Any:
    """``run()``, turning out-of-memory into `OutOfMemory`; with ``--max-memory auto``, once more on the next plan first.

    A plan is chosen from compiled bytes against what the device says it
    has; if the device then runs out anyway, the next smaller plan is tried
    once (a warning line says so) before giving up with exit code 3. Under
    jax.distributed every process calls it and all agree after each step
    (the run, the new plan, the second run): if any ran out (and none failed
    otherwise), all retry on the same next plan; otherwise all leave with
    one code.
    """
    from cogvideox_torchax import budget

    shape = tuple(shape)
    auto = budget.parse_memory(args.max_memory) is None

    def first() -> Any:
        with out_of_memory_as_exit_3(what, shape, vae, None if auto else kind):
            return run()

    result, error = _attempt(first)
    codes = _gather_codes(EXIT_OK if error is None else exit_code(error))
    if agreed_code(codes) == EXIT_OK:
        return result
    retry = auto and set(codes) <= {EXIT_OK, EXIT_OUT_OF_MEMORY}
    if _process_count() == 1 and vae.planned(shape, kind=kind) is None:
        retry = False  # no plan fits at all (MemoryBudgetError): planning again finds none either
    if not retry:
        _raise_agreed(codes, error, what)
    failed = vae.planned(shape, kind=kind)

    def plan_again() -> Any:
        with out_of_memory_as_exit_3("planning again for", shape):
            return vae.next_plan(shape, kind=kind)

    plan, plan_error = _attempt(plan_again)
    plan_codes = _gather_codes(EXIT_OK if plan_error is None else exit_code(plan_error))
    if agreed_code(plan_codes) != EXIT_OK:
        # No smaller plan (every process plans alike), or planning failed: the run's failure stands.
        _raise_agreed(codes, error or plan_error, what)
    warn_once(
        f"out of memory running the {failed.name if failed else 'planned'} program for {shape}; "
        f"retrying once with the {plan.name} plan ({budget.human(plan.bytes)})",
        args.quiet,
    )

    def second() -> Any:
        with out_of_memory_as_exit_3(what, shape, vae, kind):
            return run()

    return _settle(*_attempt(second), what)


def nonfinite_cause(vae, what: str, input_largest: float) -> str:
    """Why a decode or encode result holds NaN/Inf: NaN weights, or an input out of range for the dtype."""
    import jax.numpy as jnp

    for key, w in vae.weights.items():
        if not bool(jnp.isfinite(w).all()):
            return f"the model's weight {key!r} holds NaN or Inf; nothing was written"
    return (
        f"the {what} produced NaN or Inf: its input (largest |value| {input_largest:.3g}) is out of range for "
        f"{vae.options.dtype} computation; nothing was written"
    )


def check_finite(result, vae, what: str, input_largest: float) -> None:
    """Raises `UsageError` (exit 2, nothing written) when ``result`` holds NaN or Inf, naming the cause."""
    import numpy as np

    if not np.isfinite(result).all():
        raise UsageError(nonfinite_cause(vae, what, input_largest))


def one_line(e: BaseException) -> str:
    # ModelLoadError, LatentsError, FramesError and OutputError are
    # ValueErrors with a message written for the user; anything else is ours
    # and says its type.
    text = " ".join(str(e).split())
    return text if isinstance(e, (UsageError, OutOfMemory, ValueError)) else f"{type(e).__name__}: {text}"


def command(
    parser: Callable[[], argparse.ArgumentParser],
    argv: list[str] | None,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    print_summary: Callable[[dict[str, Any]], None],
) -> int:
    """Parses ``argv`` and runs a command; returns the exit code (see `EXIT_CODES`).

    An interrupt at any point in here ends with 130, one line and no
    traceback; argparse's own usage errors keep its exit code 2.
    """
    global _interrupted
    _interrupted = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _on_sigint)
    previous_unraisable = sys.unraisablehook
    sys.unraisablehook = _unraisable(previous_unraisable)
    args = None
    try:
        try:
            args = parser().parse_args(argv)
        except SystemExit as e:  # --help (0) or a usage error (2), already printed by argparse
            return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
        try:
            start_distributed(args)
        except UsageError as e:
            print(f"error: {one_line(e)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        with _stdout_kept_for_results() if _process_count() > 1 else contextlib.nullcontext():
            return main(args, run, print_summary)
    except KeyboardInterrupt:
        print(f"error: interrupted; {_interrupted_note(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.unraisablehook = previous_unraisable
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _interrupted_note(args: argparse.Namespace | None) -> str:
    if getattr(args, "output_dir", None):
        return "the videos already written stay; the batch in progress was not written"
    return "nothing was written"


def exit_code(e: BaseException) -> int:
    """The exit code (`EXIT_CODES`) an exception ends a command with."""
    from cogvideox_torchax.budget import MemoryBudgetError

    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(e, PeerFailed):
        return e.code
    if isinstance(e, (OutOfMemory, MemoryBudgetError)):
        return EXIT_OUT_OF_MEMORY
    return EXIT_BAD_INPUT if isinstance(e, (UsageError, ValueError)) else EXIT_ERROR


@contextlib.contextmanager
def _stdout_kept_for_results() -> Iterator[None]:
    # gloo writes its connection notes to the process's stdout (fd 1), which
    # would break --json: fd 1 goes to stderr, Python's stdout to the old fd 1.
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(2, 1)
    previous = sys.stdout
    sys.stdout = open(kept, "w", buffering=1, closefd=True)  # noqa: SIM115 - closed below
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(kept, 1)
        sys.stdout.close()
        sys.stdout = previous


def main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    print_summary: Callable[[dict[str, Any]], None],
) -> int:
    """Runs a command; returns the exit code (see `EXIT_CODES`)."""
    try:
        from cogvideox_torchax.targets import use_cpu_without_accelerators

        use_cpu_without_accelerators()
        summary = run(args)
    except KeyboardInterrupt:
        print(f"error: interrupted; {_interrupted_note(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # one line for the user; the traceback with --debug
        if args.debug and not isinstance(e, PeerFailed):
            if _process_count() == 1:
                raise
            traceback.print_exception(e)  # and leave with the code the others agreed on
        own = e.own if isinstance(e, PeerFailed) else e
        if own is not None:
            print(f"error: {one_line(own)}", file=sys.stderr)
        # A peer's failure is news on process 0 only; the peer said it itself.
        if isinstance(e, PeerFailed) and is_primary():
            print(f"error: {one_line(e)}", file=sys.stderr)
        return exit_code(e)
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        print_summary(summary)
    return int(summary.get("exit_code", EXIT_OK))
