"""``--isolate``: each system of `bench.decode` in a process of its own, gathered into one report.

A framework's device memory pool outlives the system that filled it: on an
H100, after ours decoded the 1.5 headline, JAX still held ~48 GiB (with
preallocation off) and eager torch then ran out of memory in the same
process. Isolated, the parent starts no framework at all: per system it
runs ``python -m bench.decode ... --systems S --isolate never --json``
(JAX's preallocation off, as in one process with torch) and merges the
children's reports into the report one process would print: the same keys,
the rows in the same order (shape by shape, systems as listed), each
shape's derived figures (time over ours and over the fastest torch row,
% of peak, ``fastest_torch``) recomputed across the children. Each torch
row (eager, torch.compile, channels-last) is a system of its own, so a
process of its own. ``--cold-warm`` processes start from the parent after the
children have ended. A system whose process fails gets a row per shape
with its ``error`` (the last line it printed on stderr) and ``returncode``,
and the command exits 1 after printing the report.

``auto`` isolates where JAX would find a GPU or TPU (what JAX itself looks
for, unless ``JAX_PLATFORMS`` names the CPU alone); the CPU keeps the
in-process run, whose figures earlier results and the tests read.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from bench.coldwarm import without_options
from bench.report import derive

MODES = ("auto", "always", "never")
# A failed system's row: every result figure null (as `derive` and the table expect).
_NULL_FIGURES = ("load_s", "steady_all_s", "max_abs_err", "mean_abs_err", "analytic_conv_flops")


def accelerator_attached() -> bool:
    """Whether JAX would start on a GPU or TPU here, told without starting JAX's backends."""
    platforms = [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms and set(platforms) <= {"cpu"}:
        return False
    from cogvideox_torchax.platforms.accelerators import _accelerator_visible

    return _accelerator_visible()


def wanted(mode: str) -> bool:
    """Whether ``--isolate MODE`` runs each system in its own process."""
    return mode == "always" or (mode == "auto" and accelerator_attached())


def child_env() -> dict[str, str]:
    """The environment of one system's process.

    JAX starts in every child, eager torch's too (the report's device and
    peak): preallocating 75 % of a GPU there would leave torch a quarter.
    Off in the JAX children as well, so that each system is measured under
    the allocator settings of an in-process run. A value the user set stays.
    """
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def _run_child(argv: list[str]) -> tuple[int, dict[str, Any] | None, str]:
    """Runs one system's process, its stderr passed through; (exit code, its report, its last stderr line)."""
    tail: collections.deque[str] = collections.deque(maxlen=50)
    with tempfile.TemporaryFile("w+") as out:  # a file: a long report cannot fill a pipe while stderr is read
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.decode", *argv],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=child_env(),
        )
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)
        code = proc.wait()
        out.seek(0)
        lines = out.read().strip().splitlines()
    report = None
    if code == 0 and lines:
        try:
            report = json.loads(lines[-1])
        except json.JSONDecodeError:
            code = code or 1
    last = next((line.strip() for line in reversed(tail) if line.strip()), "")
    return code, report, last


def run_isolated(args: argparse.Namespace, argv: list[str], systems: list[str]) -> tuple[dict[str, Any], bool]:
    """Each system of ``systems`` in its own process; the merged report and whether every system ran."""
    from bench.coldwarm import child_argv, cold_warm
    from bench.decode import _commit, not_run

    base = without_options(argv, flags={"--json", "--cold-warm"}, valued={"--systems", "--isolate", "--plot"})
    reports: dict[str, dict[str, Any]] = {}
    failures: dict[str, tuple[int, str]] = {}
    for name in systems:
        print(f"[bench] {name} in its own process ...", file=sys.stderr, flush=True)
        code, report, last = _run_child([*base, "--systems", name, "--isolate", "never", "--json"])
        if report is None:
            failures[name] = (code, last or f"exit code {code}")
        else:
            reports[name] = report
    first = next(iter(reports.values()), None)
    report: dict[str, Any] = {
        "command": "python -m bench.decode " + " ".join(argv),
        "commit": _commit(),
        "device": None,
        "versions": {},
        "config": {"model": args.model},
        "shape": None,
        "shapes": [],
        "sweep": args.sweep,
        "dtype": None,
        "mesh": None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "options": args.option,
        "plan": None,
        "results": [],
        "peak_tflops": None,
        "peak_source": None,
    }
    if first is not None:  # what every child measured alike: the first one's
        derived = ("command", "commit", "plan", "results", "fastest_torch")
        report.update({k: v for k, v in first.items() if k not in derived})
    report["isolated"] = True
    report["not_run"] = not_run(args)  # each child was asked for its own system alone
    report["plan"] = reports["torchax"]["plan"] if "torchax" in reports else None
    report["fastest_torch"] = []
    for shape in report["shapes"] or [None]:
        rows = []
        for name in systems:
            if name in failures:
                code, error = failures[name]
                rows.append(
                    {"system": name, "shape": shape, **dict.fromkeys(_NULL_FIGURES), "error": error, "returncode": code}
                )
            else:
                rows += [r for r in reports[name]["results"] if r["shape"] == shape]
        best = derive(rows, report["peak_tflops"])
        report["fastest_torch"] += [best] if best else []
        report["results"] += rows
    if args.cold_warm:
        cw_argv = child_argv(argv)
        for row in report["results"]:
            if row["shape"] == report["shape"] and "error" not in row:
                print(f"[bench] {row['system']} cold and warm processes ...", file=sys.stderr, flush=True)
                row.update(cold_warm(row["system"], cw_argv))
    return report, not failures
