"""``python -m bench.decode``: ours, the Flax NNX port and upstream PyTorch, measured alike.

One process, one set of latents and weights, one dtype and mesh::

    python -m bench.decode --model random:cogvideox-2b --shape 3,8,8 --shape 5,16,16 \\
        --systems torchax,flax,torch --repeats 3

Systems (`bench.systems`, one record each): ``torchax`` (this project),
``flax`` (the NNX port in `bench.flax_vae`, jitted with the weights as
arguments and sharded on the same mesh) and upstream's own decode as GPU
users would run it (CUDA when torch sees a GPU, else the CPU): ``torch``
(eager), ``torch-compile`` (its decoder under ``torch.compile``, default
mode; the first call is its compile time), ``torch-cl`` (eager, conv
weights and latents channels-last) and ``torch-compile-cl`` (both). The
report names the fastest torch row of each shape and ours' speedup over
it (``fastest_torch``). For each: load time, first call (trace + compile +
run), steady-state decode as the median of ``--repeats`` calls each ended by
``block_until_ready``, compiled temporary and argument bytes
(``memory_analysis``), peak device bytes where the backend counts them,
XLA's FLOP count (``cost_analysis``) next to the analytic convolution FLOPs
(`bench.flops`, counted on torch's meta device), the achieved TFLOP/s and its
share of the device peak (`bench.peak`) from XLA's count where it is within
5 % of the analytic one, else from the analytic one (``flops_source``), max
and mean abs error against upstream fp32 eager on the CPU, and each system's
steady time over ours and over the fastest torch row. The report's
``plan`` is what our decode decided to do (``vae.plan.as_dict()``), null
where ours has no plan.

The pieces: `bench.inputs` (model, shapes, latents), `bench.systems` (what
each system is), `bench.runners` (how each runs), `bench.coldwarm`,
`bench.flops`, `bench.report` (derived figures, table, plot).

Modes:
  ``--compile-only``  compile and report memory and FLOPs, run nothing (the
                      memory figures of large shapes);
  ``--sweep frames|resolution``  repeat over latent frame counts or sizes
                      (``--sweep-values``); ``--plot out.png`` draws them;
  ``--profile``       a per-op breakdown of one steady call (`bench.profile`);
  ``--cold-warm``     each system in two fresh processes sharing a new
                      persistent compile cache: the second one's time to
                      first frame is the warm start.

``--isolate auto|always|never``: each system in a process of its own
(`bench.isolate`), gathered into the same report; ``auto`` (the default)
where a GPU or TPU is attached, on which one framework's memory pool would
starve the next system's, while the CPU keeps the one-process run.

``--cpu-memory-scheduler`` turns on XLA:CPU's memory-aware scheduler (TPU and
GPU schedule for memory by default; the CPU does not). Nothing here is
CPU-specific: ``jax.devices()`` decides where JAX runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench import isolate
from bench.coldwarm import child, child_argv, cold_warm
from bench.inputs import (
    SWEEP_DEFAULTS,
    family,
    flax_skipped,
    latent_channels,
    latents,
    load_upstream,
    shapes,
)
from bench.report import derive, plot, print_table
from bench.runners import BENCHES
from bench.systems import SYSTEMS, system

_MEMORY_SCHEDULER_FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
_T0 = time.perf_counter()  # process start, near enough, for --cold-warm children


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.decode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET or a local diffusers VAE folder")
    p.add_argument(
        "--shape",
        action="append",
        default=None,
        help="latent T,H,W (or B,C,T,H,W); repeat to measure several shapes in one run (default 3,8,8)",
    )
    p.add_argument("--batch", type=int, default=1, help="videos per decode (with a T,H,W shape)")
    p.add_argument("--dtype", default="float32", help="float32|bfloat16|float16 (fp32/bf16/fp16 accepted)")
    p.add_argument("--mesh", default=None, help="e.g. dp=1,tp=8 (default: every device on tp)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)} (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="steady-state calls per system (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and latents")
    p.add_argument("--compile-only", action="store_true", help="compile and report memory and FLOPs; run nothing")
    p.add_argument("--sweep", choices=sorted(SWEEP_DEFAULTS), help="repeat over latent frames or resolution")
    p.add_argument("--sweep-values", default=None, help="frames: T list; resolution: H=W list (latent units)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="plot steady and compile time (matplotlib)")
    p.add_argument("--profile", action="store_true", help="per-op time breakdown of one steady call")
    p.add_argument("--cold-warm", action="store_true", help="time to first frame in two fresh processes")
    p.add_argument(
        "--isolate",
        choices=isolate.MODES,
        default="auto",
        help="each system in its own process, one report: auto (where a GPU or TPU is attached), always, never",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=BOOL",
        help="a RuntimeOptions switch for ours, e.g. frame_scan=false (repeatable)",
    )
    p.add_argument("--cpu-memory-scheduler", action="store_true", help="XLA:CPU memory-optimized scheduler")
    p.add_argument("--no-reference", action="store_true", help="skip the upstream fp32 reference (no errors)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)  # one --cold-warm process
    return p


# -- the run --------------------------------------------------------------------


def _errors(out, reference) -> tuple[float, float]:
    import numpy as np
    import torch

    if isinstance(out, torch.Tensor):
        a = out.detach().float().cpu().numpy()
    else:
        a = np.asarray(out.astype("float32"))
    d = np.abs(a.astype(np.float64) - reference.astype(np.float64))
    return float(d.max()), float(d.mean())


def _reference(upstream, z, seed: int):
    """Upstream fp32 eager decode of ``z`` on the CPU, as a numpy array.

    From torch's generator seeded ``seed``, as every system's compared call
    (a decoder injecting noise draws from it).
    """
    import torch

    from bench.inputs import decode_args

    torch.manual_seed(seed)
    with torch.no_grad():
        return upstream.decode(z, *decode_args(upstream, z)).sample.numpy()


def _commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True)
    except OSError:
        return None
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _json_config(config) -> dict[str, Any]:
    return {k: v for k, v in dict(config).items() if isinstance(v, (int, float, str, bool, list, tuple, type(None)))}


def _systems(args: argparse.Namespace) -> list[str]:
    """The systems to measure, in order (torch rows compile nothing ahead of a call: not with ``--compile-only``;
    the Flax port is CogVideoX's: not for another family's model, `not_run` says why)."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"error: unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    skipped = not_run(args)
    systems = [s for s in systems if s not in skipped]
    if not systems:
        raise SystemExit(f"error: no system to run: {'; '.join(f'{k} {v}' for k, v in skipped.items())}")
    return [s for s in systems if system(s).framework == "jax"] if args.compile_only else systems


def not_run(args: argparse.Namespace) -> dict[str, str]:
    """The systems asked for that do not run for this model, with why (the Flax port for a family not its own)."""
    asked = {s.strip() for s in args.systems.split(",")}
    why = flax_skipped(args.model) if "flax" in asked else None
    return {"flax": why} if why else {}


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark the parsed arguments describe, in this process; returns the report."""
    import jax
    import torch

    import cogvideox_torchax as ct
    from bench.flops import analytic_conv_flops, meta_twin
    from bench.peak import device_peak
    from cogvideox_torchax.config import canonical_dtype

    systems = _systems(args)
    dtype = canonical_dtype(args.dtype)
    upstream = load_upstream(args.model, args.seed)
    all_shapes = shapes(args, latent_channels(upstream))
    mesh = ct.make_mesh(args.mesh)
    argv = sys.argv[1:] if argv is None else argv
    report: dict[str, Any] = {
        "command": "python -m bench.decode " + " ".join(argv),
        "commit": _commit(),
        "device": f"{jax.devices()[0].device_kind} x{len(jax.devices())} ({jax.default_backend()})",
        "versions": {"jax": jax.__version__, "torch": torch.__version__, **_other_versions()},
        "config": {"model": args.model, **_json_config(upstream.config)},
        "family": family(upstream).name,
        "not_run": not_run(args),
        "shape": list(all_shapes[0]),
        "shapes": [list(s) for s in all_shapes],
        "sweep": args.sweep,
        "dtype": dtype,
        "mesh": dict(mesh.shape),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "options": args.option,
        "plan": None,
        "results": [],
        "fastest_torch": [],
        "isolated": False,
    }
    peak_tflops, peak_source = (None, None) if args.compile_only else device_peak(dtype)
    report["peak_tflops"], report["peak_source"] = peak_tflops, peak_source
    twin = meta_twin(upstream)  # shapes only: the convolution count at any size, in every mode
    for shape in all_shapes:
        z = latents(shape, args.seed)
        conv_flops = analytic_conv_flops(upstream, shape, twin)
        reference = None
        if not args.compile_only and not args.no_reference:
            reference = _reference(upstream, z, args.seed)
        rows = []
        for name in systems:
            print(f"[bench] {name} {shape} ...", file=sys.stderr, flush=True)
            row = {"system": name, "shape": list(shape), **BENCHES[name](upstream, z, args)}
            out = row.pop("output", None)
            row["max_abs_err"] = row["mean_abs_err"] = None
            row["analytic_conv_flops"] = conv_flops
            if reference is not None and out is not None:
                row["max_abs_err"], row["mean_abs_err"] = _errors(out, reference)
            del out
            if "plan" in row:  # ours: the first shape's plan is the report's, a different one stays
                plan = row.pop("plan")
                if shape == all_shapes[0]:
                    report["plan"] = plan
                elif plan != report["plan"]:
                    row["plan"] = plan
            rows.append(row)
        best = derive(rows, peak_tflops)
        report["fastest_torch"] += [best] if best else []
        report["results"] += rows
    if args.cold_warm:
        cw_argv = child_argv(argv)
        for row in report["results"]:
            if row["shape"] == list(all_shapes[0]):
                print(f"[bench] {row['system']} cold and warm processes ...", file=sys.stderr, flush=True)
                row.update(cold_warm(row["system"], cw_argv))
    return report


def _other_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torchax", "diffusers", "flax"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if not args.child and isolate.wanted(args.isolate):
        # The parent starts no framework: each child sets its own environment.
        report, complete = isolate.run_isolated(args, argv, _systems(args))
        _emit(report, args)
        return 0 if complete else 1
    if args.cpu_memory_scheduler:
        # Must be in the environment before jax initialises its backend.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _MEMORY_SCHEDULER_FLAG).strip()
    if any(system(s).framework == "torch" for s in args.systems.split(",") if s in SYSTEMS):
        # JAX takes 75 % of a GPU's memory up front by default, which would
        # leave eager torch in the same process too little at 768x1360 (its
        # decode peaks at 45 GiB). Growing on demand leaves it the rest.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.child:
        return child(args, _T0)
    _emit(run(args, argv), args)
    return 0


def _emit(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)


if __name__ == "__main__":
    sys.exit(main())
