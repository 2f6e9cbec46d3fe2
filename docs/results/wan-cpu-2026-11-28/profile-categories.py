"""Per-category time of one steady Wan 2.1 decode at (1,16,3,16,16), fp32, the plan's program (`bench.profile`).

Run from the project root: `PYTHONPATH=. python docs/results/wan-cpu-2026-11-28/profile-categories.py`.
Prints the categories, then the slowest data-movement and elementwise ops.
"""

import jax
import torch

import cogvideox_torchax as ct
from bench.profile import op_breakdown

vae = ct.wrap(ct.random_upstream("wan2.1", seed=0), mesh="dp=1,tp=1", dtype="float32")
compiled, args = vae.prepare("decode", torch.randn(1, 16, 3, 16, 16))


def run():
    return jax.block_until_ready(compiled(*args))


run()
breakdown = op_breakdown(run, compiled.as_text(), top=400)
print(breakdown["categories"])
for op in breakdown["top_ops"]:
    if op["category"] in ("pad/slice/concat", "elementwise", "transpose/copy"):
        print(op["category"], op["op"], round(op["ms"], 1), op["count"])
