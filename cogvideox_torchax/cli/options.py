"""The options both commands take (model, run, several processes): parsed once into frozen, checked options.

`RunOptions.from_args` turns what argparse parsed into typed options and
refuses bad values (`errors.UsageError`, exit 2) before anything loads;
each command builds its own frozen configuration around them, and nothing
below the command modules sees the ``argparse.Namespace``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from typing import Any

from cogvideox_torchax import families, spellings
from cogvideox_torchax.cli import errors
from cogvideox_torchax.memory import in_use
from cogvideox_torchax.platforms import accelerators

RANDOM_PREFIX = "random:"

# torch's generators take seeds 0 .. 2^64 - 1 (--seed, --sample-seed).
SEED_RANGE = (0, 2**64 - 1)


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors as one ``error:`` line (exit 2); the usage block is ``--help``'s."""

    @classmethod
    def for_command(cls, name: str, doc: str) -> Parser:
        """The parser of ``python -m cogvideox_torchax.NAME``: its module docstring's second paragraph, the exit codes."""
        return cls(
            prog=f"python -m cogvideox_torchax.{name}",
            description=doc.split("\n\n")[1].replace("\n", " "),
            epilog=errors.EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(errors.EXIT_BAD_INPUT, f"error: {' '.join(message.split())} (see --help)\n")

    def help_when_shown(self, dest: str, make: Callable[[], str]) -> None:
        """``dest``'s help made by ``make`` when ``--help`` is shown, not when the parser is built.

        For help read from the models' geometry, which imports diffusers and
        torch: options are checked before any framework loads.
        """
        self.shown_help = {**getattr(self, "shown_help", {}), dest: make}

    def format_help(self) -> str:  # noqa: D102 - argparse's
        made = getattr(self, "shown_help", {})
        for action in self._actions:
            if action.dest in made:
                action.help = made[action.dest]()
        return super().format_help()


def check_range(flag: str, value: float, low: float, high: float | None = None) -> None:
    """Refuses a numeric option outside ``[low, high]`` (or below ``low``), NaN and infinities included.

    Raises:
        errors.UsageError: naming the option, its value and the range.
    """
    ok = value == value and value not in (float("inf"), float("-inf")) and value >= low
    ok = ok and (high is None or value <= high)
    if not ok:
        span = f"from {_number(low)} to {_number(high)}" if high is not None else f"at least {_number(low)}"
        raise errors.UsageError(f"{flag} must be a number {span}, got {value!r}")


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def check_output_path(flag: str, output: str, inputs: list[str], is_dir: bool) -> None:
    """Refuses an output that names a folder where a file is written, or that is one of the inputs.

    Raises:
        errors.UsageError: a trailing slash on a file output, or an output that would replace an input.
    """
    if not is_dir and output.endswith(("/", os.sep)):
        raise errors.UsageError(f"{flag} {output!r} ends with a slash, which names a folder; this output is a file")
    target = os.path.realpath(output)
    for source in inputs:
        if os.path.realpath(source) == target or (
            os.path.exists(source) and os.path.exists(output) and os.path.samefile(source, output)
        ):
            raise errors.UsageError(f"{flag} {output!r} is the input {source!r}: an output never replaces an input")


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """Which model, in which dtype, over which mesh, under which memory budget (``--target``: for which accelerator)."""

    model: str
    subfolder: str | None
    dtype: str
    mesh: str | None
    seed: int
    max_memory: str
    target: str | None
    untiled: bool = False


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """How this process joins a jax.distributed cluster (none of it: it runs alone)."""

    distributed: bool = False
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    timeout_s: float = 300.0

    @property
    def joins(self) -> bool:
        return self.distributed or any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The options both commands take, checked."""

    model: ModelOptions
    distributed: DistributedOptions
    compile_cache: str | None = None
    use_compile_cache: bool = True
    memory_report: bool = False
    dry_run: bool = False
    quiet: bool = False
    json: bool = False
    debug: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """Checks and types what `add_model_arguments`, `add_run_arguments` and `add_distributed_arguments` parsed.

        Raises:
            errors.UsageError: a dtype, memory budget, target or timeout that cannot be.
        """
        check_shared_cheaply(args)
        dtype = spellings.dtype_name(args.dtype)
        model = ModelOptions(args.model, args.subfolder, dtype, args.mesh, args.seed, str(args.max_memory), args.target,
                             args.untiled)
        joins = DistributedOptions(
            args.distributed, args.coordinator, args.num_processes, args.process_id, args.distributed_timeout
        )
        report = args.memory_report or in_use.enabled_by_env()
        return cls(model, joins, args.compile_cache, not args.no_compile_cache, report, args.dry_run, args.quiet,
                   args.json, args.debug)

    def silenced(self) -> RunOptions:
        """The same options for a process that reports nothing (not process 0 of a cluster)."""
        return dataclasses.replace(self, quiet=True, json=False)


def check_shared_cheaply(args: argparse.Namespace) -> None:
    """The checks of the shared options that import no framework (torch, JAX, diffusers): run before any that do.

    Raises:
        errors.UsageError: a dtype or memory budget that cannot be, a seed or timeout out of range, a
            ``--target`` without ``--dry-run`` or unknown.
    """
    try:
        spellings.dtype_name(args.dtype)
    except ValueError as e:
        raise errors.UsageError(str(e)) from e
    try:
        spellings.parse_memory(args.max_memory)
    except ValueError as e:
        raise errors.UsageError(f"--max-memory: {e}") from e
    check_range("--distributed-timeout", args.distributed_timeout, 1e-3)
    check_range("--seed", args.seed, *SEED_RANGE)
    if args.target is not None:
        if not args.dry_run:
            raise errors.UsageError("--target plans for an accelerator that is not here: it needs --dry-run")
        try:
            accelerators.target_mesh(args.target, args.mesh)
        except (ValueError, accelerators.TargetUnavailableError) as e:
            raise errors.UsageError(f"--target: {e}") from e


def with_shared_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``p`` with the run and multi-process options both commands take last (`add_run_arguments`, ...)."""
    add_run_arguments(p)
    add_distributed_arguments(p)
    return p


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
        help="seconds (> 0) to wait for every process to join (default 300), then exit 1 with one line",
    )


def by_family(describe: Callable[[Any], str], separator: str = ", ") -> str:
    """What each family's record says (``describe(family)``), families that say the same named together.

    The commands' help is made from the records, so that a family added is
    described without editing a help text.
    """
    said: dict[str, list[str]] = {}
    for family in families.FAMILIES.values():
        said.setdefault(describe(family), []).append(family.title)
    def named(titles: list[str]) -> str:
        return titles[0] if len(titles) == 1 else f"{', '.join(titles[:-1])} and {titles[-1]}"

    return separator.join(f"{named(titles)} {what}" for what, titles in said.items())


def spatial_factors(family: Any) -> str:
    """The spatial factors of a family's published configs (its presets other than test ones), as ``8`` or ``8/16``."""
    scales = {family.spatial_scale(config) for name, config in family.presets.items() if "tiny" not in name}
    return "/".join(str(s) for s in sorted(scales))


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model, runtime and reporting options both commands take."""
    # Every family's presets, as its record names them.
    presets = "; ".join(f"{family.title} " + " / ".join(f"{RANDOM_PREFIX}{name}" for name in family.presets)
                        for family in families.FAMILIES.values())
    p.add_argument(
        "--model",
        default="THUDM/CogVideoX-2b",
        help=f"local diffusers folder (or a pipeline folder with vae/), hub id, or {RANDOM_PREFIX}PRESET with seeded "
        f"random weights, no download: {presets}; default THUDM/CogVideoX-2b",
    )
    p.add_argument("--subfolder", default=None,
                   help="VAE folder inside --model (default 'vae' for hub ids and pipeline folders)")
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32, bfloat16 or float16 (fp32/bf16/fp16); float16 overflows above 65504 (refused, exit 2)",
    )
    p.add_argument("--mesh", default=None, help="device mesh, e.g. dp=1,tp=8 (default: all devices on tp)")
    p.add_argument("--seed", type=int, default=0, help=f"seed for {RANDOM_PREFIX} models, 0 to 2^64-1 (default 0)")
    windowed = [f.title for f in families.FAMILIES.values() if f.untiled_settings]
    whole = [f.title for f in families.FAMILIES.values() if f.untiled_settings is not None and not f.untiled_settings]
    p.add_argument(
        "--untiled",
        action="store_true",
        help="the whole video through the decoder (encoder) at once, as upstream with its frame windows off: "
        f"{' and '.join(windowed)} (whose default decode blends windows of frames, another video; "
        f"{' and '.join(whole)} {'decodes' if len(whole) == 1 else 'decode'} whole by default); other families "
        "have no windows to turn off (refused)",
    )


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
