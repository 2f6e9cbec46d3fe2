"""``python -m bench.decode``: ours, the Flax NNX port and upstream PyTorch, measured alike.

One process, one set of latents and weights, one dtype and mesh::

    python -m bench.decode --model random:cogvideox-2b --shape 3,8,8 --shape 5,16,16 \\
        --systems torchax,flax,torch --repeats 3

Systems: ``torchax`` (this project), ``flax`` (the NNX port in
`bench.flax_vae`, jitted with the weights as arguments and sharded on the
same mesh) and ``torch`` (upstream eager; CUDA when torch sees a GPU, else
the CPU). For each: load time, first call (trace + compile + run),
steady-state decode as the median of ``--repeats`` calls each ended by
``block_until_ready``, compiled temporary and argument bytes
(``memory_analysis``), peak device bytes where the backend counts them,
XLA's FLOP count (``cost_analysis``) with the achieved TFLOP/s and its share
of the device peak (`bench.peak`), max and mean abs error against upstream
fp32 eager on the CPU, and each system's steady time over ours.

Modes:
  ``--compile-only``  compile and report memory and FLOPs, run nothing (the
                      memory figures of large shapes);
  ``--sweep frames|resolution``  repeat over latent frame counts or sizes
                      (``--sweep-values``); ``--plot out.png`` draws them;
  ``--profile``       a per-op breakdown of one steady call (`bench.profile`);
  ``--cold-warm``     each system in two fresh processes sharing a new
                      persistent compile cache: the second one's time to
                      first frame is the warm start.

``--cpu-memory-scheduler`` turns on XLA:CPU's memory-aware scheduler (TPU and
GPU schedule for memory by default; the CPU does not). Nothing here is
CPU-specific: ``jax.devices()`` decides where JAX runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

SYSTEMS = ("torchax", "flax", "torch")
SWEEP_DEFAULTS = {"frames": "1,3,5,9", "resolution": "8,16,24,32"}
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
    p.add_argument("--dtype", default="float32", help="float32|bfloat16 (fp32/bf16 accepted)")
    p.add_argument("--mesh", default=None, help="e.g. dp=1,tp=8 (default: every device on tp)")
    p.add_argument("--systems", default="torchax,flax,torch", help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--repeats", type=int, default=3, help="steady-state calls per system (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and latents")
    p.add_argument("--compile-only", action="store_true", help="compile and report memory and FLOPs; run nothing")
    p.add_argument("--sweep", choices=sorted(SWEEP_DEFAULTS), help="repeat over latent frames or resolution")
    p.add_argument("--sweep-values", default=None, help="frames: T list; resolution: H=W list (latent units)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="plot steady and compile time (matplotlib)")
    p.add_argument("--profile", action="store_true", help="per-op time breakdown of one steady call")
    p.add_argument("--cold-warm", action="store_true", help="time to first frame in two fresh processes")
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


# -- inputs -------------------------------------------------------------------


def _load_upstream(model: str, seed: int):
    from diffusers import AutoencoderKLCogVideoX

    import cogvideox_torchax as ct

    if model.startswith("random:"):
        return ct.random_upstream(model[len("random:") :], seed=seed)
    return AutoencoderKLCogVideoX.from_pretrained(model).eval()


def _shapes(args: argparse.Namespace, channels: int) -> list[tuple[int, ...]]:
    shapes = []
    for text in args.shape or ["3,8,8"]:
        values = [int(v) for v in text.split(",")]
        if len(values) == 3:
            values = [args.batch, channels, *values]
        elif len(values) != 5:
            raise SystemExit(f"error: --shape takes T,H,W or B,C,T,H,W, got {text!r}")
        if values[1] != channels:
            raise SystemExit(f"error: the model has {channels} latent channels, --shape says {values[1]}")
        shapes.append(tuple(values))
    if not args.sweep:
        return shapes
    if len(shapes) > 1:
        raise SystemExit("error: --sweep takes one --shape to sweep from")
    b, c, t, h, w = shapes[0]
    sweep = [int(v) for v in (args.sweep_values or SWEEP_DEFAULTS[args.sweep]).split(",")]
    if args.sweep == "frames":
        return [(b, c, v, h, w) for v in sweep]
    return [(b, c, t, v, v) for v in sweep]


def _latents(shape: tuple[int, ...], seed: int):
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _options(args: argparse.Namespace):
    import cogvideox_torchax as ct

    switches = {}
    for item in args.option:
        name, _, value = item.partition("=")
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"error: --option {item!r}: expected NAME=true|false")
        switches[name] = value.lower() in ("true", "1")
    return ct.RuntimeOptions(dtype=args.dtype, **switches)


# -- measurements shared by the jitted systems ---------------------------------


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


def _steady(fn, repeats: int) -> tuple[list[float], Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return times, out


def _run_compiled(row: dict[str, Any], compiled, run, args: argparse.Namespace, t_compiled: float) -> dict[str, Any]:
    """Fills the rows' run figures for a compiled JAX program (``run`` calls it and blocks)."""
    row.update(_memory(compiled))
    row["flops"] = _flops(compiled)
    if args.compile_only:
        return row
    t = time.perf_counter()
    run()
    row["first_call_s"] = row["compile_s"] + time.perf_counter() - t
    row["time_to_first_frame_s"] = time.perf_counter() - t_compiled + row["load_s"] + row["compile_s"]
    row["steady_all_s"], row["output"] = _steady(run, args.repeats)
    row["peak_device_bytes"] = _peak_device_bytes()
    if args.profile:
        from bench.profile import op_breakdown

        row["profile"] = op_breakdown(run, compiled.as_text())
    return row


def bench_torchax(upstream, z, args: argparse.Namespace) -> dict[str, Any]:
    import jax

    import cogvideox_torchax as ct

    t0 = time.perf_counter()
    vae = ct.wrap(upstream, mesh=args.mesh, options=_options(args))
    jax.block_until_ready(vae.weights)
    t1 = time.perf_counter()
    compiled = vae.compile_decode(tuple(z.shape))
    t2 = time.perf_counter()
    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": t2 - t1, "mesh": dict(vae.mesh.shape)}
    zj = vae._device_latents(z)
    return _run_compiled(row, compiled, lambda: jax.block_until_ready(compiled(vae.weights, zj)), args, t2)


def bench_flax(upstream, z, args: argparse.Namespace) -> dict[str, Any]:
    import jax

    import cogvideox_torchax as ct
    from bench import flax_vae
    from cogvideox_torchax.config import canonical_dtype

    mesh = ct.make_mesh(args.mesh)
    t0 = time.perf_counter()
    port = flax_vae.from_upstream(upstream, dtype=canonical_dtype(args.dtype), mesh=mesh)
    jax.block_until_ready(port.state)
    t1 = time.perf_counter()
    compiled = port.lower(tuple(z.shape)).compile()
    t2 = time.perf_counter()
    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": t2 - t1, "mesh": dict(mesh.shape)}
    # The latents go where the compiled program expects them (its sharding).
    zj = jax.device_put(z.float().numpy().astype(port.dtype), compiled.input_shardings[0][1])
    return _run_compiled(row, compiled, lambda: jax.block_until_ready(compiled(port.state, zj)), args, t2)


def bench_torch(upstream, z, args: argparse.Namespace) -> dict[str, Any]:
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

    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": None, "device": device}
    if args.compile_only:
        return row
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    run()
    row["first_call_s"] = time.perf_counter() - t
    row["time_to_first_frame_s"] = row["load_s"] + row["first_call_s"]
    row["steady_all_s"], row["output"] = _steady(run, args.repeats)
    row["peak_device_bytes"] = torch.cuda.max_memory_allocated() if device == "cuda" else None
    if args.profile:
        row["profile"] = _torch_breakdown(run, device)
    return row


def _torch_breakdown(run, device: str) -> dict[str, Any]:
    """The same breakdown for eager torch, from torch.profiler's per-op self times."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    rows = [(e.key, getattr(e, attr) / 1e3, e.count) for e in prof.key_averages()]
    rows = [r for r in rows if r[1] > 0]

    def kind(name: str) -> str:
        n = name.lower()
        if "conv" in n or "mkldnn" in n or "cudnn" in n:
            return "convolution"
        if "mm" in n or "matmul" in n or "linear" in n:
            return "matmul"
        if "norm" in n or "mean" in n or "var" in n or "sum" in n:
            return "reduction"
        if any(k in n for k in ("copy", "contiguous", "permute", "transpose", "clone", "to_copy")):
            return "transpose/copy"
        if any(k in n for k in ("pad", "cat", "slice", "index", "upsample", "interpolate")):
            return "pad/slice/concat"
        return "elementwise" if n.startswith("aten::") else "other"

    total = sum(r[1] for r in rows) or 1.0
    cats: dict[str, list[float]] = {}
    for name, ms, count in rows:
        c = cats.setdefault(kind(name), [0.0, 0])
        c[0] += ms
        c[1] += count
    categories = [
        {"category": k, "ms": v[0], "share": v[0] / total, "count": v[1]}
        for k, v in sorted(cats.items(), key=lambda kv: -kv[1][0])
    ]
    top = sorted(rows, key=lambda r: -r[1])[:8]
    top_ops = [{"op": n, "category": kind(n), "ms": ms, "count": c} for n, ms, c in top]
    return {"total_ms": total, "categories": categories, "top_ops": top_ops}


BENCHES = {"torchax": bench_torchax, "flax": bench_flax, "torch": bench_torch}


# -- cold vs warm starts --------------------------------------------------------


def _child(args: argparse.Namespace) -> int:
    """One fresh process: load, compile (through the persistent cache) and decode once."""
    from cogvideox_torchax import compile_cache

    if args.child != "torch":
        compile_cache.enable_compile_cache(os.environ["COGVIDEOX_TORCHAX_CACHE_DIR"])
    upstream = _load_upstream(args.model, args.seed)
    shape = _shapes(args, upstream.config.latent_channels)[0]
    args.repeats, args.profile, args.compile_only = 0, False, False
    with compile_cache.count_cache_events() as events:
        row = BENCHES[args.child](upstream, _latents(shape, args.seed), args)
    print(
        json.dumps(
            {
                "process_to_first_frame_s": time.perf_counter() - _T0,
                "time_to_first_frame_s": row["time_to_first_frame_s"],
                "compile_s": row["compile_s"],
                "cache_hits": events.hits,
                "cache_misses": events.misses,
            }
        )
    )
    return 0


def cold_warm(system: str, argv: list[str]) -> dict[str, Any]:
    """Runs ``system`` in two fresh processes sharing a new compile cache; both reports."""
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:
        env = dict(os.environ, COGVIDEOX_TORCHAX_CACHE_DIR=cache)
        runs = []
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-m", "bench.decode", *argv, "--child", system],
                capture_output=True,
                text=True,
                env=env,
            )
            if done.returncode != 0:
                raise RuntimeError(f"--cold-warm {system} child failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    return {
        "cold_first_frame_s": cold["time_to_first_frame_s"],
        "warm_first_frame_s": warm["time_to_first_frame_s"],
        "cold_process_s": cold["process_to_first_frame_s"],
        "warm_process_s": warm["process_to_first_frame_s"],
        "cold_compile_s": cold["compile_s"],
        "warm_compile_s": warm["compile_s"],
        "cold_cache_misses": cold["cache_misses"],
        "warm_cache_hits": warm["cache_hits"],
        "warm_cache_misses": warm["cache_misses"],
    }


def _child_argv(argv: list[str]) -> list[str]:
    """The parent's arguments without the modes a child must not repeat."""
    drop_flag = {"--cold-warm", "--profile", "--json", "--compile-only", "--no-reference"}
    drop_value = {"--plot", "--sweep", "--sweep-values", "--systems", "--repeats"}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in drop_flag:
            continue
        if key in drop_value:
            skip = "=" not in a
            continue
        out.append(a)
    return out


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


def _valid_taps(n: int, k: int, p: int, s: int, d: int) -> int:
    """Kernel taps that land inside an input of length ``n``, summed over all outputs of one dim."""
    out = (n + 2 * p - d * (k - 1) - 1) // s + 1
    return sum(1 for o in range(out) for t in range(k) if 0 <= o * s - p + t * d < n)


def _reference(upstream, z):
    """Upstream fp32 eager decode of ``z`` and its analytic convolution FLOPs.

    Every convolution upstream runs is counted from its shapes: 2 FLOPs per
    multiply-add whose input is real data, not zero padding (the count XLA's
    cost analysis makes too; causal time padding is real frames and counts).
    Bias adds are not counted. This is the work the decode must do; XLA's
    count of ours also holds the elementwise ops and any waste.
    """
    import math

    import torch

    total = 0

    def count(module, inputs, output):
        nonlocal total
        x = inputs[0]
        taps = math.prod(
            _valid_taps(n, k, p, s, d)
            for n, k, p, s, d in zip(
                x.shape[2:], module.kernel_size, module.padding, module.stride, module.dilation, strict=True
            )
        )
        total += 2 * x.shape[0] * module.out_channels * (module.in_channels // module.groups) * taps

    hooks = [m.register_forward_hook(count) for m in upstream.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    try:
        with torch.no_grad():
            out = upstream.decode(z).sample.numpy()
    finally:
        for h in hooks:
            h.remove()
    return out, total


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


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark the parsed arguments describe; returns the report."""
    import jax
    import torch

    import cogvideox_torchax as ct
    from bench.peak import device_peak
    from cogvideox_torchax.config import canonical_dtype

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"error: unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if args.compile_only:
        systems = [s for s in systems if s != "torch"]
    dtype = canonical_dtype(args.dtype)
    upstream = _load_upstream(args.model, args.seed)
    shapes = _shapes(args, upstream.config.latent_channels)
    mesh = ct.make_mesh(args.mesh)
    argv = sys.argv[1:] if argv is None else argv
    report: dict[str, Any] = {
        "command": "python -m bench.decode " + " ".join(argv),
        "commit": _commit(),
        "device": f"{jax.devices()[0].device_kind} x{len(jax.devices())} ({jax.default_backend()})",
        "versions": {"jax": jax.__version__, "torch": torch.__version__, **_other_versions()},
        "config": {"model": args.model, **_json_config(upstream.config)},
        "shape": list(shapes[0]),
        "shapes": [list(s) for s in shapes],
        "sweep": args.sweep,
        "dtype": dtype,
        "mesh": dict(mesh.shape),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "options": args.option,
        "results": [],
    }
    peak_tflops, peak_source = (None, None) if args.compile_only else device_peak(dtype)
    report["peak_tflops"], report["peak_source"] = peak_tflops, peak_source
    for shape in shapes:
        z = _latents(shape, args.seed)
        reference, conv_flops = None, None
        if not args.compile_only and not args.no_reference:
            reference, conv_flops = _reference(upstream, z)
        rows = []
        for name in systems:
            print(f"[bench] {name} {shape} ...", file=sys.stderr, flush=True)
            row = {"system": name, "shape": list(shape), **BENCHES[name](upstream, z, args)}
            out = row.pop("output", None)
            row["max_abs_err"] = row["mean_abs_err"] = None
            row["analytic_conv_flops"] = conv_flops
            row["flops_vs_analytic"] = row.get("flops") / conv_flops if row.get("flops") and conv_flops else None
            if reference is not None and out is not None:
                row["max_abs_err"], row["mean_abs_err"] = _errors(out, reference)
            del out
            rows.append(row)
        _derive(rows, peak_tflops)
        report["results"] += rows
    if args.cold_warm:
        child_argv = _child_argv(argv)
        for row in report["results"]:
            if row["shape"] == list(shapes[0]):
                print(f"[bench] {row['system']} cold and warm processes ...", file=sys.stderr, flush=True)
                row.update(cold_warm(row["system"], child_argv))
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


def _derive(rows: list[dict[str, Any]], peak_tflops: float | None) -> None:
    """Steady medians, TFLOP/s, share of peak and time relative to ours, in place."""
    for row in rows:
        times = row.get("steady_all_s")
        row["steady_s"] = statistics.median(times) if times else None
    ours = next((r for r in rows if r["system"] == "torchax"), {})
    # Eager torch has no FLOP count of its own: its rate uses ours (the same
    # decode), and its `flops` stays null.
    same_work = ours.get("flops")
    for row in rows:
        flops = row.get("flops") or same_work
        row["tflops_per_s"] = flops / row["steady_s"] / 1e12 if flops and row["steady_s"] else None
        row["pct_of_peak"] = 100 * row["tflops_per_s"] / peak_tflops if row["tflops_per_s"] and peak_tflops else None
        row["time_vs_ours"] = row["steady_s"] / ours["steady_s"] if ours.get("steady_s") and row["steady_s"] else None
        for key in ("compile_s", "first_call_s", "temp_bytes", "argument_bytes", "peak_device_bytes", "flops"):
            row.setdefault(key, None)


# -- output ---------------------------------------------------------------------


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "GiB":
        return f"{v / 2**30:.3f}"
    if unit == "G":
        return f"{v / 1e9:.4g}"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.4g}"
    return str(v)


COLUMNS = [
    ("load_s", "load s", ""),
    ("compile_s", "compile s", ""),
    ("first_call_s", "first call s", ""),
    ("steady_s", "steady s", ""),
    ("temp_bytes", "temp GiB", "GiB"),
    ("argument_bytes", "args GiB", "GiB"),
    ("peak_device_bytes", "peak GiB", "GiB"),
    ("flops", "GFLOP", "G"),
    ("flops_vs_analytic", "FLOP/conv FLOP", ""),
    ("tflops_per_s", "TFLOP/s", ""),
    ("pct_of_peak", "% peak", ""),
    ("max_abs_err", "max err", ""),
    ("mean_abs_err", "mean err", ""),
    ("time_vs_ours", "time/ours", ""),
]
COLD_WARM_COLUMNS = [
    ("cold_first_frame_s", "cold first frame s", ""),
    ("warm_first_frame_s", "warm first frame s", ""),
    ("warm_process_s", "warm process s", ""),
    ("warm_cache_hits", "warm cache hits", ""),
    ("warm_cache_misses", "warm cache misses", ""),
]


def print_table(report: dict[str, Any]) -> None:
    print(f"# {report['command']}")
    print(f"# commit {report['commit']}, device {report['device']}, mesh {report['mesh']}, {report['dtype']}")
    print(f"# versions {report['versions']}")
    if report.get("xla_flags"):
        print(f"# XLA_FLAGS={report['xla_flags']}")
    if report.get("peak_tflops"):
        print(f"# peak {report['peak_tflops']:.3g} TFLOP/s ({report['peak_source']})")
    cols = COLUMNS + (COLD_WARM_COLUMNS if any("cold_first_frame_s" in r for r in report["results"]) else [])
    print("| system | latents | " + " | ".join(c[1] for c in cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for row in report["results"]:
        vals = [_fmt(row.get(key), unit) for key, _, unit in cols]
        print(f"| {row['system']} | {tuple(row['shape'])} | " + " | ".join(vals) + " |")
    profiled = [r for r in report["results"] if r.get("profile")]
    if profiled:
        from bench.profile import format_breakdown

        print("\n## Where the time goes (one steady call)")
        for row in profiled:
            print()
            print("\n".join(format_breakdown(f"{row['system']} {tuple(row['shape'])}", row["profile"])))


def plot(report: dict[str, Any], path: str) -> None:
    """Steady and compile (first-call for torch) time against the swept axis, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = report.get("sweep") or "frames"
    index = 2 if axis == "frames" else 3
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for system in dict.fromkeys(r["system"] for r in report["results"]):
        rows = [r for r in report["results"] if r["system"] == system]
        xs = [r["shape"][index] for r in rows]
        a1.plot(xs, [r.get("steady_s") for r in rows], "o-", label=system)
        compile_key = "first_call_s" if system == "torch" else "compile_s"
        a2.plot(xs, [r.get(compile_key) for r in rows], "o-", label=system)
    xlabel = "latent frames" if axis == "frames" else "latent height = width"
    a1.set(xlabel=xlabel, ylabel="steady decode s (median)", title="decode time")
    a2.set(xlabel=xlabel, ylabel="s", title="compile (torch: first call)")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend()
    fig.suptitle(f"{report['config']['model']}, {report['dtype']}, {report['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.cpu_memory_scheduler:
        # Must be in the environment before jax initialises its backend.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _MEMORY_SCHEDULER_FLAG).strip()
    if args.child:
        return _child(args)
    report = run(args, argv)
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
