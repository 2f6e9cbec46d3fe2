"""``python -m bench.decode``: time and size the decode, ours against upstream.

One process, one set of latents and weights, each system measured the same
way::

    python -m bench.decode --model random:cogvideox-2b --shape 1,16,3,8,8 \\
        --systems torchax,torch --repeats 3

For each system: load time, first call (trace + compile + run), steady-state
decode as the median of ``--repeats`` calls each ended by
``block_until_ready``, compiled temporary and argument bytes
(``memory_analysis``), XLA's FLOP count (``cost_analysis``) with the achieved
TFLOP/s and its share of the device peak, the max and mean abs error against
upstream fp32 eager on the CPU, and the steady time relative to ours.

``--compile-only`` lowers and compiles ours without running it, for shapes
too large to decode here (the memory figures of issue 4).
``--cpu-memory-scheduler`` turns on XLA:CPU's memory-aware scheduler (TPU
and GPU schedule for memory by default; the CPU does not).

Systems: ``torchax`` (this project) and ``torch`` (upstream eager, CUDA when
torch sees a GPU, else CPU). The Flax peer arrives with issue 5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

SYSTEMS = ("torchax", "torch")
_MEMORY_SCHEDULER_FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET or a local diffusers VAE folder")
    p.add_argument("--shape", default="1,16,3,8,8", help="latent shape B,C,T,H,W")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--mesh", default=None, help="e.g. dp=1,tp=8 (default: every device on tp)")
    p.add_argument("--systems", default="torchax,torch", help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--repeats", type=int, default=3, help="steady-state calls per system (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and latents")
    p.add_argument("--compile-only", action="store_true", help="compile ours and report memory; run nothing")
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
    return p


def _load_upstream(model: str, seed: int):
    from diffusers import AutoencoderKLCogVideoX

    import cogvideox_torchax as ct

    if model.startswith("random:"):
        return ct.random_upstream(model[len("random:") :], seed=seed)
    return AutoencoderKLCogVideoX.from_pretrained(model).eval()


def _memory(compiled) -> dict[str, int | None]:
    m = compiled.memory_analysis()
    if m is None:
        return {"temp_bytes": None, "argument_bytes": None}
    return {"temp_bytes": int(m.temp_size_in_bytes), "argument_bytes": int(m.argument_size_in_bytes)}


def _flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def _peak_device_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _steady(fn, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_torchax(upstream, z, args) -> dict[str, Any]:
    import jax

    import cogvideox_torchax as ct

    switches = {}
    for item in args.option:
        name, _, value = item.partition("=")
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"error: --option {item!r}: expected NAME=true|false")
        switches[name] = value.lower() in ("true", "1")
    options = ct.RuntimeOptions(dtype=args.dtype, **switches)
    t0 = time.perf_counter()
    vae = ct.wrap(upstream, mesh=args.mesh, options=options)
    jax.block_until_ready(vae.weights)
    t1 = time.perf_counter()
    compiled = vae.compile_decode(tuple(z.shape))
    t2 = time.perf_counter()
    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": t2 - t1, **_memory(compiled), "flops": _flops(compiled)}
    row["mesh"] = dict(vae.mesh.shape)
    if args.compile_only:
        return row
    zj = vae._device_latents(z)
    run = lambda: jax.block_until_ready(compiled(vae.weights, zj))  # noqa: E731
    t = time.perf_counter()
    run()
    row["first_call_s"] = t2 - t1 + time.perf_counter() - t
    row["steady_s"], out = _steady(run, args.repeats)
    row["peak_device_bytes"] = _peak_device_bytes()
    row["output"] = out
    return row


def bench_torch(upstream, z, args) -> dict[str, Any]:
    import torch

    from cogvideox_torchax.config import canonical_dtype

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[canonical_dtype(args.dtype)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    module = _load_upstream(args.model, args.seed).to(device=device, dtype=dtype)
    zt = z.to(device=device, dtype=dtype)
    t1 = time.perf_counter()

    def run():
        with torch.no_grad():
            out = module.decode(zt).sample
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    run()
    row: dict[str, Any] = {"load_s": t1 - t0, "first_call_s": time.perf_counter() - t, "device": device}
    row["steady_s"], out = _steady(run, args.repeats)
    row["peak_device_bytes"] = torch.cuda.max_memory_allocated() if device == "cuda" else None
    row["output"] = out
    return row


def _errors(out, reference) -> tuple[float, float]:
    import numpy as np
    import torch

    if isinstance(out, torch.Tensor):
        a = out.detach().float().cpu().numpy()
    else:
        a = np.asarray(out.astype("float32"))
    d = np.abs(a.astype(np.float64) - reference.astype(np.float64))
    return float(d.max()), float(d.mean())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the benchmark the parsed arguments describe; returns the report."""
    import jax
    import torch

    from bench.peak import device_peak
    from cogvideox_torchax.config import canonical_dtype

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"error: unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if args.compile_only:
        systems = ["torchax"]
    shape = tuple(int(v) for v in args.shape.split(","))
    dtype = canonical_dtype(args.dtype)
    upstream = _load_upstream(args.model, args.seed)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(args.seed))
    report: dict[str, Any] = {
        "command": "python -m bench.decode " + " ".join(sys.argv[1:]),
        "device": f"{jax.devices()[0].device_kind} x{len(jax.devices())} ({jax.default_backend()})",
        "versions": {"jax": jax.__version__, "torch": torch.__version__},
        "latents": list(shape),
        "dtype": dtype,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "options": args.option,
        "systems": {},
    }
    reference = None
    if not args.compile_only and not args.no_reference:
        with torch.no_grad():
            reference = upstream.decode(z).sample.numpy()
    peak_tflops, peak_source = (None, None) if args.compile_only else device_peak(dtype)
    report["peak_tflops"], report["peak_source"] = peak_tflops, peak_source
    for name in systems:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        row = (bench_torchax if name == "torchax" else bench_torch)(upstream, z, args)
        out = row.pop("output", None)
        if reference is not None and out is not None:
            row["max_abs_err"], row["mean_abs_err"] = _errors(out, reference)
        report["systems"][name] = row
    ours = report["systems"].get("torchax", {})
    flops = ours.get("flops")
    for row in report["systems"].values():
        if flops and row.get("steady_s"):
            row["tflops"] = flops / row["steady_s"] / 1e12
            if peak_tflops:
                row["percent_of_peak"] = 100 * row["tflops"] / peak_tflops
        if ours.get("steady_s") and row.get("steady_s"):
            row["time_vs_ours"] = row["steady_s"] / ours["steady_s"]
    return report


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "GiB":
        return f"{v / 2**30:.3f}"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.4g}"
    return str(v)


def print_table(report: dict[str, Any]) -> None:
    print(f"# {report['command']}")
    print(f"# device {report['device']}, latents {report['latents']}, {report['dtype']}, versions {report['versions']}")
    if report.get("xla_flags"):
        print(f"# XLA_FLAGS={report['xla_flags']}")
    if report.get("peak_tflops"):
        print(f"# peak {report['peak_tflops']:.3g} TFLOP/s ({report['peak_source']})")
    cols = [
        ("load_s", "load s", ""),
        ("compile_s", "compile s", ""),
        ("first_call_s", "first call s", ""),
        ("steady_s", "steady s", ""),
        ("temp_bytes", "temp GiB", "GiB"),
        ("argument_bytes", "args GiB", "GiB"),
        ("peak_device_bytes", "peak GiB", "GiB"),
        ("flops", "GFLOP", ""),
        ("tflops", "TFLOP/s", ""),
        ("percent_of_peak", "% peak", ""),
        ("max_abs_err", "max err", ""),
        ("mean_abs_err", "mean err", ""),
        ("time_vs_ours", "time/ours", ""),
    ]
    print("| system | " + " | ".join(c[1] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, row in report["systems"].items():
        vals = []
        for key, _, unit in cols:
            v = row.get(key)
            vals.append(_fmt(v / 1e9 if key == "flops" and v else v, unit))
        print(f"| {name} | " + " | ".join(vals) + " |")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cpu_memory_scheduler:
        # Must be in the environment before jax initialises its backend.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _MEMORY_SCHEDULER_FLAG).strip()
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
