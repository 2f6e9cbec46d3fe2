"""What the ``decode`` and ``encode`` commands share: model options, stages, errors.

Both are thin command lines over the library with the same rules: progress
bars per stage on stderr, a summary (or ``--json``) on stdout, bad input as
one line on stderr with exit code 2 and no output, 1 for our own errors, 130
when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RANDOM_PREFIX = "random:"


class UsageError(Exception):
    """Bad input; reported as one line with exit code 2."""


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
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars and no summary")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def check_dtype(args: argparse.Namespace) -> None:
    from cogvideox_torchax.config import canonical_dtype

    try:
        canonical_dtype(args.dtype)
    except ValueError as e:
        raise UsageError(str(e)) from e


def compile_cache_from_args(args: argparse.Namespace) -> Path | None:
    """Turns the persistent compile cache on (returns its folder) or off (None) as the options say."""
    from cogvideox_torchax import compile_cache

    if args.no_compile_cache:
        compile_cache.disable_compile_cache()
        return None
    return compile_cache.enable_compile_cache(args.compile_cache)


def load_model(args: argparse.Namespace):
    """The `TorchaxVAE` that ``--model`` / ``--subfolder`` / ``--dtype`` / ``--mesh`` / ``--seed`` name."""
    import cogvideox_torchax as ct

    if args.model.startswith(RANDOM_PREFIX):
        preset = args.model[len(RANDOM_PREFIX) :]
        try:
            module = ct.random_upstream(preset, seed=args.seed)
        except ValueError as e:
            raise UsageError(str(e)) from e
        return ct.wrap(module, dtype=args.dtype, mesh=args.mesh)
    subfolder = args.subfolder
    if subfolder is None and not Path(args.model).exists():
        subfolder = "vae"
    return ct.from_pretrained(args.model, subfolder=subfolder, dtype=args.dtype, mesh=args.mesh)


class Stage:
    """One progress bar per stage on stderr (nothing when quiet); times the stage."""

    def __init__(self, name: str, total: int, unit: str, quiet: bool):
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=f"{name:<8}", unit=unit, disable=quiet, file=sys.stderr, leave=True)
        self._t0 = time.perf_counter()
        self.seconds = 0.0

    def tick(self, n: int = 1) -> None:
        self._bar.update(n)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._bar.close()


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


def one_line(e: BaseException) -> str:
    # ModelLoadError, LatentsError, FramesError and OutputError are
    # ValueErrors with a message written for the user; anything else is ours
    # and says its type.
    text = " ".join(str(e).split())
    return text if isinstance(e, (UsageError, ValueError)) else f"{type(e).__name__}: {text}"


def main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    print_summary: Callable[[dict[str, Any]], None],
) -> int:
    """Runs a command; returns the exit code (0, 1 internal error, 2 bad input, 130 interrupted)."""
    try:
        summary = run(args)
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback with --debug
        if args.debug:
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2 if isinstance(e, (UsageError, ValueError)) else 1
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        print_summary(summary)
    return 0
