"""``python -m bench.memory_plan``: which plan the memory planner picks under each budget, compile-only.

Compiles every candidate of `TorchaxVAE.memory_candidates` once (nothing
runs) and applies the planner's own rule (`cogvideox_torchax.memory.planner.choose`)
to each budget: the first candidate whose compiled bytes fit the budget less
`cogvideox_torchax.memory.budget.SAFETY_MARGIN`, smaller tiles not tried once
they stop saving memory::

    python -m bench.memory_plan --shape 13,60,90 --budgets 8,16,32
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.memory_plan", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET or a local diffusers VAE folder")
    p.add_argument("--shape", default="13,60,90", help="latent T,H,W")
    p.add_argument("--budgets", default="8,16,32", help="GiB per device, comma separated")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import jax

    import cogvideox_torchax as ct
    from cogvideox_torchax.memory import budget
    from bench.inputs import latent_channels, load_upstream
    from cogvideox_torchax.memory.planner import choose

    upstream = load_upstream(args.model, seed=0)
    t, h, w = (int(v) for v in args.shape.split(","))
    shape = (1, latent_channels(upstream), t, h, w)
    vae = ct.wrap(upstream, dtype=args.dtype, mesh="dp=1,tp=1")
    t0 = time.perf_counter()
    candidates = vae.memory_candidates(shape)
    seconds = time.perf_counter() - t0
    rows = []
    for gib in (float(v) for v in args.budgets.split(",")):
        plan = choose(candidates, lambda c: c.bytes, budget.usable(int(gib * 2**30))).chosen
        rows.append({"budget_gib": gib, "plan": plan.name if plan else None, "bytes": plan.bytes if plan else None})
    report = {
        "command": "python -m bench.memory_plan " + " ".join(sys.argv[1:] if argv is None else argv),
        "shape": list(shape),
        "dtype": vae.options.dtype,
        "device": jax.devices()[0].device_kind,
        "candidates": [{"plan": c.name, "bytes": c.bytes} for c in candidates],
        "compile_s": round(seconds, 1),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"# {report['command']}\n# latents {shape}, {report['dtype']}, {report['device']}, {seconds:.0f} s to compile all")
    print("| candidate | compiled GiB |\n|---|---|")
    for c in candidates:
        print(f"| {c.name} | {c.bytes / 2**30:.2f} |")
    print("| budget GiB | plan | compiled GiB |\n|---|---|---|")
    for r in rows:
        size = "-" if r["bytes"] is None else f"{r['bytes'] / 2**30:.2f}"
        print(f"| {r['budget_gib']:g} | {r['plan'] or 'none fits (MemoryBudgetError)'} | {size} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
