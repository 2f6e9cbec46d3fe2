"""The systems `bench.decode` measures (`bench.systems`), each run the same way on the same latents.

Each runner takes the upstream module, the latents and the parsed arguments
and returns one result row: load and compile time, first and steady calls,
compiled memory, peak device memory, XLA's FLOP count (jitted systems) and,
with ``--profile``, a per-op breakdown. ``output`` holds the last decode
(the caller compares it with the reference and drops it). Every torch row
is one runner, `bench_torch`, set by its record (torch.compile,
channels-last).
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

from bench.inputs import decode_args, load_upstream, options
from bench.systems import RECORDS, System, system

# -- measurements shared by the jitted systems ---------------------------------


def _memory(compiled) -> dict[str, int | None]:
    m = compiled.memory_analysis()
    if m is None:
        return {"temp_bytes": None, "argument_bytes": None}
    return {"temp_bytes": int(m.temp_size_in_bytes), "argument_bytes": int(m.argument_size_in_bytes)}


def _xla_flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def _peak_device_bytes() -> int | None:
    """JAX's peak bytes in use on the first device since the process started (None: no counter)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _own_peak(row: dict[str, Any], before: int | None) -> None:
    """Sets the row's peak device bytes from JAX's process-wide peak.

    JAX's counter cannot be reset, so a system that runs after another one
    sees the earlier peak too. When the peak rose during this system's run it
    is this system's own; otherwise only a bound is known: the peak stays
    null and ``peak_device_bytes_at_most`` says the bound.
    """
    after = _peak_device_bytes()
    row["peak_device_bytes"] = after if after is not None and (not before or after > before) else None
    if after is not None and row["peak_device_bytes"] is None:
        row["peak_device_bytes_at_most"] = after


def _steady(fn, repeats: int) -> tuple[list[float], Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return times, out


def _run_compiled(row: dict[str, Any], compiled, run, args: argparse.Namespace, t_compiled: float, peak_before) -> None:
    """Fills the row's run figures for a compiled JAX program (``run`` calls it and blocks).

    ``peak_before``: JAX's peak device bytes before the system loaded.
    """
    row.update(_memory(compiled))
    row["flops"] = _xla_flops(compiled)
    if args.compile_only:
        return
    t = time.perf_counter()
    run()
    row["first_call_s"] = row["compile_s"] + time.perf_counter() - t
    row["time_to_first_frame_s"] = time.perf_counter() - t_compiled + row["load_s"] + row["compile_s"]
    row["steady_all_s"], row["output"] = _steady(run, args.repeats)
    _own_peak(row, peak_before)
    if args.profile:
        from bench.profile import op_breakdown

        row["profile"] = op_breakdown(run, compiled.as_text())


# -- the systems ------------------------------------------------------------------


def bench_torchax(upstream, z, args: argparse.Namespace) -> dict[str, Any]:
    import jax
    import torch

    import cogvideox_torchax as ct

    peak_before = _peak_device_bytes()
    t0 = time.perf_counter()
    vae = ct.wrap(upstream, mesh=args.mesh, options=options(args))
    jax.block_until_ready(vae.weights)
    t1 = time.perf_counter()
    compiled = vae.compile_decode(tuple(z.shape))
    t2 = time.perf_counter()
    plan = getattr(vae, "plan", None)  # what our decode decided to do, where it says
    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": t2 - t1, "mesh": dict(vae.mesh.shape)}
    row["plan"] = plan.as_dict() if plan is not None else None
    # The plan's own mesh and weights (a memory plan may move to more tp devices); noise a decoder injects is
    # drawn here, from the generator state the reference started from.
    torch.manual_seed(args.seed)
    compiled, call_args = vae.prepare("decode", z, vae.family.decode_input_values(vae.config, z.shape[0], {}))
    _run_compiled(row, compiled, lambda: jax.block_until_ready(compiled(*call_args)), args, t2, peak_before)
    return row


def bench_flax(upstream, z, args: argparse.Namespace) -> dict[str, Any]:
    import jax

    import cogvideox_torchax as ct
    from bench import flax_vae
    from cogvideox_torchax.config import canonical_dtype

    mesh = ct.make_mesh(args.mesh)
    peak_before = _peak_device_bytes()
    t0 = time.perf_counter()
    port = flax_vae.from_upstream(upstream, dtype=canonical_dtype(args.dtype), mesh=mesh)
    jax.block_until_ready(port.state)
    t1 = time.perf_counter()
    compiled = port.lower(tuple(z.shape)).compile()
    t2 = time.perf_counter()
    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": t2 - t1, "mesh": dict(mesh.shape)}
    # The latents go where the compiled program expects them (its sharding).
    zj = jax.device_put(z.float().numpy().astype(port.dtype), compiled.input_shardings[0][1])
    _run_compiled(row, compiled, lambda: jax.block_until_ready(compiled(port.state, zj)), args, t2, peak_before)
    return row


def channels_last(module) -> None:
    """Every convolution weight of ``module`` channels-last, in place: Conv3d's in ``channels_last_3d``, Conv2d's in
    ``channels_last``.

    Both families' upsamplers hold 2-D convolutions (4-D weights), on which
    ``module.to(memory_format=torch.channels_last_3d)`` raises; they take the
    same layout in two dimensions, so that every convolution of the row has a
    channels-last weight. Other weights (norms' scales) stay as they are, and
    upstream's code too: where its pads and concatenations hand a convolution
    a contiguous input, that is what a user converting the module gets.
    """
    import torch

    formats = {5: torch.channels_last_3d, 4: torch.channels_last}
    for m in module.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd) and m.weight.dim() in formats:
            m.weight.data = m.weight.data.contiguous(memory_format=formats[m.weight.dim()])


def _dynamo_counts() -> dict[str, int]:
    """torch.compile's graphs and graph breaks so far in this process (dynamo's counters)."""
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}


def bench_torch(system: System, upstream, z, args: argparse.Namespace) -> dict[str, Any]:
    """Upstream's own decode, eager or its decoder under ``torch.compile`` (default mode), channels-last or not.

    A fresh copy of the module (``upstream`` stays as it is), on CUDA where
    torch sees a GPU. ``torch.compile`` compiles on the first call: from
    ``compile()`` to that call's end is the row's compile time (``compile_s``
    = ``first_call_s``), the steady time the median of the calls after it; ``torch_compile`` counts
    its graphs and graph breaks (a decode that fell back to eager shows).
    """
    import torch

    from cogvideox_torchax.config import canonical_dtype

    dtype = getattr(torch, canonical_dtype(args.dtype))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    module = load_upstream(args.model, args.seed).to(device=device, dtype=dtype)
    zt = z.to(device=device, dtype=dtype)
    if system.channels_last:
        channels_last(module)
        zt = zt.contiguous(memory_format=torch.channels_last_3d)
    t1 = time.perf_counter()

    extra = decode_args(module, zt)

    def run():
        torch.manual_seed(args.seed)  # a decoder injecting noise draws what the reference drew
        with torch.no_grad():
            out = module.decode(zt, *extra).sample
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    # The CPU has no peak counter torch keeps.
    row: dict[str, Any] = {"load_s": t1 - t0, "compile_s": None, "device": device, "peak_device_bytes": None}
    if args.compile_only:
        return row
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = None
    t = time.perf_counter()
    if system.torch_compile:  # on the clock: torch.compile's setup (its first one imports inductor) is its cost
        torch._dynamo.reset()  # another compiled row of this process leaves no graph or recompile count behind
        before = _dynamo_counts()
        module.decoder.compile()  # the per-frame-batch network; decode's own loop and caches stay upstream's
    run()
    row["first_call_s"] = time.perf_counter() - t
    if system.torch_compile:
        row["compile_s"] = row["first_call_s"]
    row["time_to_first_frame_s"] = row["load_s"] + row["first_call_s"]
    row["steady_all_s"], row["output"] = _steady(run, args.repeats)
    if before is not None:  # after the steady calls: a recompile there counts too
        row["torch_compile"] = {k: v - before[k] for k, v in _dynamo_counts().items()}
    row["peak_device_bytes"] = torch.cuda.max_memory_allocated() if device == "cuda" else None
    if args.profile:
        row["profile"] = _torch_breakdown(run, device)
    return row


_TORCH_MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear"}


def _torch_kind(name: str) -> str:
    n = name.lower()
    if "conv" in n or "mkldnn" in n or "cudnn" in n:
        return "convolution"
    if n.removeprefix("aten::") in _TORCH_MATMULS or "scaled_dot_product" in n:
        return "matmul"
    if "norm" in n or "mean" in n or "var" in n or "sum" in n:
        return "reduction"
    if any(k in n for k in ("copy", "contiguous", "permute", "transpose", "clone", "to_copy")):
        return "transpose/copy"
    if any(k in n for k in ("pad", "cat", "slice", "index", "upsample", "interpolate")):
        return "pad/slice/concat"
    return "elementwise" if n.startswith("aten::") else "other"


def _torch_breakdown(run, device: str) -> dict[str, Any]:
    """`bench.profile`'s breakdown for eager torch, from torch.profiler's per-op self times."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    # On CUDA a kernel's time is a row of its own and also its launching
    # op's self time, and runtime rows ("Command Buffer Full": launches that
    # waited) carry kernel time too (on an H100 it came to more than the
    # aten ops' own): the aten ops' rows alone count each kernel once.
    every = list(prof.key_averages())
    ops = [e for e in every if e.key.startswith("aten::")]
    events = ops if device == "cuda" and any(getattr(e, attr) > 0 for e in ops) else every
    rows = [(e.key, getattr(e, attr) / 1e3, e.count) for e in events]
    rows = [r for r in rows if r[1] > 0]
    total = sum(r[1] for r in rows) or 1.0
    cats: dict[str, list[float]] = {}
    for name, ms, count in rows:
        c = cats.setdefault(_torch_kind(name), [0.0, 0])
        c[0] += ms
        c[1] += count
    categories = [
        {"category": k, "ms": v[0], "share": v[0] / total, "count": v[1]}
        for k, v in sorted(cats.items(), key=lambda kv: -kv[1][0])
    ]
    top = sorted(rows, key=lambda r: -r[1])[:8]
    top_ops = [{"op": n, "category": _torch_kind(n), "ms": ms, "count": c} for n, ms, c in top]
    return {"total_ms": total, "categories": categories, "top_ops": top_ops}


def runner(name: str):
    """The runner of the system ``name``: ours, the Flax port, or `bench_torch` set by the torch row's record."""
    record = system(name)
    if record.framework == "torch":
        return functools.partial(bench_torch, record)
    return {"torchax": bench_torchax, "flax": bench_flax}[name]


BENCHES = {s.name: runner(s.name) for s in RECORDS}
