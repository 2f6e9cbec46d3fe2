"""``python -m bench.suite``: the standard accelerator set in one call, as one JSON and a results-page draft.

::

    python -m bench.suite --out results-h100          # a GPU or TPU machine, the project installed
    python -m bench.suite --quick --out /tmp/smoke    # the same steps at tiny sizes: a CPU smoke run

Each step is one command of an existing module (`bench.decode`,
`bench.stream`, or the README's decode command), run in a process of its
own under a timeout; a step that fails or times out is recorded and the
suite goes on. `bench.decode` steps run each system in its own process
where an accelerator is attached (``--isolate``). Under ``--out``, rewritten
after every step (a run cut short keeps what it measured):
``suite.json`` (each step's command, exit code, wall time, the JSON it
printed, the end of its stderr; device, hardware, versions, commit) and
``results-draft.md`` (dated; hardware, versions and commit, the commands
once at the top, the table of the H100 page, the failures).

The steps are one table, `bench.suite_steps.STEPS`: a new row is a new
measurement, a new model family's rows name their ``family`` (the Flax
port, `bench.flax_vae`, is CogVideoX's decoder alone). A kind of step
makes its command here (`COMMANDS`) and its rows of the page in
`bench.suite_page` (`ROWS`).

``cogvideox_torchax.kernels`` is the repository's kernels/ (through the link
``cogvideox_torchax/kernels``, or installed there from a wheel); a package
folder without it is said in one line, exit 2.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.suite_page import draft, failures
from bench.suite_steps import STEPS, SYSTEMS, Step, step_systems


@dataclasses.dataclass(frozen=True)
class Context:
    """What every step's command is made from."""

    quick: bool
    dtype: str
    systems: tuple[str, ...]
    isolate: str
    examples: Path
    work: Path  # a temporary folder for the README command's input and output

    def model(self, step: Step) -> str:
        return step.quick_model if self.quick else step.model

    def shape(self, step: Step) -> str:
        return step.quick_shape if self.quick else step.shape

    def repeats(self, step: Step) -> int:
        return 1 if self.quick else step.repeats


# -- commands -------------------------------------------------------------------------


def _decode_argv(step: Step, ctx: Context, *extra: str) -> list[str]:
    return [
        "-m", "bench.decode", "--model", ctx.model(step), "--dtype", ctx.dtype, "--shape", ctx.shape(step),
        "--systems", ",".join(step_systems(step, ctx.systems)), "--repeats", str(ctx.repeats(step)), *extra, "--json",
    ]  # fmt: skip


def _decode(step: Step, ctx: Context) -> list[str]:
    return _decode_argv(step, ctx, "--no-reference", "--isolate", ctx.isolate)


def _parity(step: Step, ctx: Context) -> list[str]:
    # Against upstream fp32 on the CPU; a small shape, whose pools cannot
    # starve one another: one process computes the reference once.
    return _decode_argv(step, ctx, "--isolate", "never")


def _cold_warm(step: Step, ctx: Context) -> list[str]:
    return _decode_argv(step, ctx, "--no-reference", "--cold-warm", "--isolate", ctx.isolate)


def _profile(step: Step, ctx: Context) -> list[str]:
    return _decode_argv(step, ctx, "--no-reference", "--profile", "--isolate", ctx.isolate)


def _stream(step: Step, ctx: Context) -> list[str]:
    chosen = step_systems(step, ctx.systems)
    systems = (["whole", "streamed"] if "torchax" in chosen else []) + (["torch"] if "torch" in chosen else [])
    return ["-m", "bench.stream", "--model", ctx.model(step), "--dtype", ctx.dtype, "--shape", ctx.shape(step),
            "--systems", ",".join(systems), "--repeats", str(ctx.repeats(step)), "--json"]  # fmt: skip


def _latents_file(step: Step, ctx: Context) -> Path:
    """The README command's latents: the bundled example (``--quick``: seeded ones of the tiny shape, written here)."""
    shape = [int(v) for v in ctx.shape(step).split(",")]
    name = "latents_" + "x".join(map(str, shape)) + ".safetensors"
    if not ctx.quick:
        return ctx.examples / name
    path = ctx.work / name
    if not path.exists():
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"latents": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}, str(path))
    return path


def _readme(step: Step, ctx: Context) -> list[str]:
    # The README's main command as written there (its default dtype), --json for the figures.
    return ["-m", "cogvideox_torchax.decode", str(_latents_file(step, ctx)), "--model", ctx.model(step),
            "--output", str(ctx.work / f"{step.name}.mp4"), "--json"]  # fmt: skip


COMMANDS: dict[str, Callable[[Step, Context], list[str]]] = {
    "decode": _decode,
    "parity": _parity,
    "cold-warm": _cold_warm,
    "profile": _profile,
    "stream": _stream,
    "readme": _readme,
}  # a step's kind -> its command after ``python``


# -- running -------------------------------------------------------------------------


def kernels_missing() -> str | None:
    """One line saying why the project's kernels are not importable here, or None where they are.

    Looked up without importing the package (nothing of torch or JAX
    starts in the suite's own process): its folder must hold ``kernels/``,
    the link to the repository's kernels/ in a source tree, the folder
    itself once installed from a wheel.
    """
    spec = importlib.util.find_spec("cogvideox_torchax")
    if spec is None:
        return "error: cogvideox_torchax is not importable: install the project (pip install -e . or its wheel)"
    where = list(spec.submodule_search_locations or [])[0]
    if (Path(where) / "kernels" / "conv.py").is_file():
        return None
    return (
        f"error: {where} holds no kernels/ (cogvideox_torchax.kernels: in a source tree, the link "
        "cogvideox_torchax/kernels -> ../kernels, which a checkout without links loses): check out the "
        "repository with links, or install its wheel"
    )


def _kill(proc: subprocess.Popen) -> None:
    """Ends the step's process and its children (its process group: a GPU's memory is theirs until they end)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Runs one step's process (its stderr passed through); exit code, wall time, its JSON, the end of its output."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
        process_group=0,  # a group of its own, in this session: a timeout or an interrupt ends its children too
    )  # fmt: skip
    out: list[str] = []
    err: collections.deque[str] = collections.deque(maxlen=60)

    def drain_err() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            err.append(line)

    readers = [threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),
               threading.Thread(target=drain_err, daemon=True)]  # fmt: skip
    for r in readers:
        r.start()
    timed_out = False
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # also on Ctrl-C or SIGTERM: the group is not the terminal's foreground, nothing else ends it
        if proc.poll() is None:
            _kill(proc)
    for r in readers:
        r.join(30)
    stdout = "".join(out)
    report = None
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                pass
            break
    return {
        "rc": proc.returncode, "timed_out": timed_out, "wall_s": round(time.perf_counter() - start, 2),
        "stdout_json": report, "stdout_tail": None if report is not None else stdout[-2000:],
        "stderr_tail": "".join(err)[-3000:],
    }  # fmt: skip


def _error_line(record: dict[str, Any]) -> str:
    if record["timed_out"]:
        return f"timed out after {record['wall_s']:.0f} s"
    lines = [line.strip() for line in (record["stderr_tail"] or "").splitlines() if line.strip()]
    return f"exit code {record['rc']}" + (f": {lines[-1][:300]}" if lines else "")


def run_step(step: Step, ctx: Context, timeout_s: float | None) -> dict[str, Any]:
    """One step: its record for the JSON (command, outcome, its JSON), skipped where none of its systems is chosen."""
    systems = step_systems(step, ctx.systems)
    record: dict[str, Any] = {"name": step.name, "kind": step.kind, "label": step.label, "model": ctx.model(step),
                              "shape": ctx.shape(step), "family": step.family, "systems": list(systems)}  # fmt: skip
    if not systems:
        return {**record, "skipped": f"none of its systems ({', '.join(step.systems)}) chosen"}
    argv = COMMANDS[step.kind](step, ctx)
    record["command"] = shlex.join(["python", *argv])
    if step.kind == "readme" and not Path(argv[2]).exists():
        return {
            **record,
            "rc": None,
            "timed_out": False,
            "wall_s": 0.0,
            "stdout_json": None,
            "stdout_tail": None,
            "stderr_tail": "",
            "error": f"{argv[2]} not found (--examples DIR: the project's examples/)",
        }
    print(f"[suite] {step.name}: {record['command']}", file=sys.stderr, flush=True)
    record.update(run_command(argv, timeout_s or step.timeout_s))
    if record["rc"] != 0 or record["stdout_json"] is None:
        record["error"] = _error_line(record)
    print(f"[suite] {step.name}: exit {record['rc']} in {record['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return record


# -- what the page states once -------------------------------------------------------


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt",
                "libtpu", "torch", "torchax", "diffusers", "flax", "numpy", "av", "cogvideox-torchax"):  # fmt: skip
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def hardware() -> dict[str, Any]:
    """The machine: CPU model and cores, and the GPUs as nvidia-smi names them (where it is installed)."""
    out: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            out["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        if done.returncode == 0:
            out["gpus"] = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return out


def project() -> dict[str, Any]:
    """Where the measured package is imported from, and how: an installed wheel, an editable install, a source tree."""
    from importlib.metadata import distributions

    spec = importlib.util.find_spec("cogvideox_torchax")
    location = list(spec.submodule_search_locations or [])[0] if spec else None
    editable = set()
    for dist in distributions(name="cogvideox-torchax"):  # a source tree's egg-info is one too: the pip record's
        url = json.loads(dist.read_text("direct_url.json") or "{}")
        if url.get("dir_info", {}).get("editable"):
            editable.add(url["url"].removeprefix("file://"))
    if location is None:
        how = None
    elif not (Path(location) / "kernels").is_symlink():  # kernels/ a folder in the package: from a wheel
        how = "installed"
    elif str(Path(location).parent) in editable:
        how = "editable install"
    else:
        how = "source tree"
    return {"location": location, "installed": how}


# -- the command ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.splitlines()[0])
    p.add_argument(
        "--out",
        default=f"bench-suite-{datetime.date.today().isoformat()}",
        help="folder for suite.json and results-draft.md (made if missing; default bench-suite-DATE)",
    )
    p.add_argument("--quick", action="store_true", help="the same steps at tiny sizes (random:tiny, random:wan-tiny): a CPU smoke run")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--skip", action="append", default=[], metavar="STEP[,STEP]", help="steps not to run (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="STEP[,STEP]",
                   help="run these steps alone, in this order")
    p.add_argument("--dtype", default="bf16", help="the decode steps' dtype (the README command keeps its own)")
    p.add_argument(
        "--isolate",
        choices=("auto", "always", "never"),
        default="auto",
        help="bench.decode's --isolate for the large decodes (auto: own processes on a GPU or TPU)",
    )
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="every step's time limit (default: each its own)"
    )
    p.add_argument(
        "--examples",
        default=str(Path(__file__).resolve().parent.parent / "examples"),
        help="the project's examples/ folder (the README command's latents)",
    )
    p.add_argument("--list", action="store_true", help="print the steps' commands and run nothing")
    return p  # fmt: skip


def _names(values: list[str]) -> list[str]:
    """The step names of repeatable ``STEP[,STEP]`` options, once each, in the order given."""
    return list(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    by_name = {s.name: s for s in STEPS}
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    unknown = set(_names(args.skip) + _names(args.only)) - by_name.keys()
    bad = sorted(unknown) or sorted(set(systems) - set(SYSTEMS))
    if bad:
        print(f"error: unknown {'steps' if unknown else 'systems'} {bad}; steps: {', '.join(sorted(by_name))}; "
              f"systems: {', '.join(SYSTEMS)}", file=sys.stderr)  # fmt: skip
        return 2
    missing = kernels_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    # --only runs its steps in its own order: what matters most first on a machine lent for minutes.
    chosen = [by_name[n] for n in _names(args.only)] or list(STEPS)
    steps = [s for s in chosen if s.name not in _names(args.skip)]
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as work:
        ctx = Context(args.quick, args.dtype, systems, args.isolate, Path(args.examples), Path(work))
        if args.list:
            for step in steps:
                print(shlex.join(["python", *COMMANDS[step.kind](step, ctx)]) if step_systems(step, systems)
                      else f"# {step.name}: skipped (none of its systems chosen)")  # fmt: skip
            return 0
        from bench.decode import _commit

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # ends the running step's group

        out.mkdir(parents=True, exist_ok=True)
        suite: dict[str, Any] = {
            "command": shlex.join(["python", "-m", "bench.suite", *argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "quick": args.quick, "dtype": args.dtype, "systems": list(systems), "isolate": args.isolate,
            "commit": _commit(), "versions": versions(), "hardware": hardware(), "project": project(),
            "device": None, "steps": [], "failures": [],
        }  # fmt: skip
        for step in steps:
            record = run_step(step, ctx, args.timeout)
            suite["steps"].append(record)
            suite["device"] = suite["device"] or (record.get("stdout_json") or {}).get("device")
            suite["failures"] = failures(suite)
            _write(out, suite)  # after every step: a run cut short keeps what it measured
        _write(out, suite)
    print(draft(suite), end="")
    print(f"[suite] wrote {out / 'suite.json'} and {out / 'results-draft.md'}; "
          f"{len(suite['failures'])} failure(s)", file=sys.stderr)  # fmt: skip
    return 1 if suite["failures"] else 0


def _write(out: Path, suite: dict[str, Any]) -> None:
    (out / "suite.json").write_text(json.dumps(suite, indent=1) + "\n")
    (out / "results-draft.md").write_text(draft(suite))


if __name__ == "__main__":
    sys.exit(main())
