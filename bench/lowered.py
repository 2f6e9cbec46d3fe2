"""What a decode program for another platform looks like, built on any machine without its hardware.

``python -m bench.lowered --platform tpu --shape 21,96,170`` lowers our
decode for that platform (`TorchaxVAE.lower_decode(shape, platform=...)`)
and prints its plan, its convolutions (count, dtypes, layouts, the largest
operand), the analytic convolution FLOPs, the bytes the convolutions read
and write (a lower bound on memory traffic) and XLA's byte count of the
unrolled, unoptimised program (an upper bound: nothing is fused yet).
Nothing runs and nothing is compiled, so times derived from it are
estimates: FLOPs over the chip's peak and bytes over its bandwidth are
lower bounds on the decode's time.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from typing import Any

import cogvideox_torchax as ct
from bench.flops import analytic_conv_flops, conv_io_elements
from bench.inputs import family, latent_channels, load_upstream, unrolled_options
from cogvideox_torchax.platforms import hlo


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.lowered", description=__doc__.splitlines()[0])
    p.add_argument("--platform", default="tpu", help="cpu, cuda, rocm or tpu: the program's target")
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET or a local diffusers VAE folder")
    p.add_argument("--shape", default="13,60,90", help="latent T,H,W (batch 1, the model's channels)")
    p.add_argument("--dtype", default="bfloat16", help="float32|bfloat16 (fp32/bf16 accepted)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def describe(upstream: Any, shape: tuple[int, ...], platform: str, dtype: str) -> dict[str, Any]:
    """The lowered decode's plan, convolutions, FLOPs and bytes (see the module docstring)."""
    vae = ct.wrap(upstream, dtype=dtype, mesh="dp=1,tp=1")
    text = vae.lower_decode(shape, platform=platform).as_text()
    convs = hlo.convolutions(text)
    # The scanned program counts its loop body once; the unrolled one (the family's loop switches off,
    # upstream's loops traced) counts every frame batch.
    options = unrolled_options(vae.options.dtype, family(upstream).name)
    unrolled = ct.wrap(upstream, dtype=dtype, mesh="dp=1,tp=1", options=options)
    cost = unrolled.lower_decode(shape, platform=platform).cost_analysis() or {}
    # None where every convolution is a call into the host's torch (LTX's fp32 CPU programs).
    largest = max(convs, key=lambda c: c.max_elements, default=None)
    return {
        "platform": platform,
        "shape": list(shape),
        "dtype": vae.options.dtype,
        "plan": vae.plan_for(platform).as_dict(),
        "convolutions": len(convs),
        "host_convolutions": text.count(hlo.HOST_CONV_TARGET),
        "conv_dtypes": dict(collections.Counter(f"{c.input_dtype}->{c.output_dtype}" for c in convs)),
        "conv_layouts": dict(collections.Counter(c.input_layout for c in convs)),
        "largest_conv_elements": largest.max_elements if largest else None,
        "largest_conv_input": list(largest.input_shape) if largest else None,
        "analytic_conv_flops": analytic_conv_flops(upstream, shape),
        "conv_io_bytes": conv_io_elements(upstream, shape) * (2 if vae.options.dtype == "bfloat16" else 4),
        "xla_unoptimised_bytes": cost.get("bytes accessed"),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    upstream = load_upstream(args.model, seed=0)
    t, h, w = (int(v) for v in args.shape.split(","))
    report = describe(upstream, (1, latent_channels(upstream), t, h, w), args.platform, args.dtype)
    if args.json:
        print(json.dumps(report))
        return 0
    for key, value in report.items():
        print(f"{key:24s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
