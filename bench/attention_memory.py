"""``python -m bench.attention_memory``: HunyuanVideo's frame-causal attention compiled for an accelerator not attached.

The middle blocks of HunyuanVideo's decoders (1.0 and 1.5) attend over every
latent token of the video; upstream builds a dense ``tokens x tokens`` mask
for it. This compiles `kernels.frame_causal_attention` (blockwise, no mask)
for each target's compile-only device at a video's latent size and prints
the compiled program's temporaries beside what upstream's untiled decode
would allocate for that attention, from the shapes alone: its mask
(``tokens^2`` in the activation dtype) and, where torch's math path runs,
the scores and their softmax (as many again each)::

    python -m bench.attention_memory --target h200 --target v6e-1 --video 129,720,1280 --channels 512
    python -m bench.attention_memory --target h200 --video 121,720,1280 --channels 1024 --spatial 16  # 1.5

Nothing runs: these are the compiled program's facts, not times on a device.
"""

from __future__ import annotations

import argparse
import json
import time

GIB = 2**30


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.attention_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", action="append", required=True, help="h100, h200, v5e-1, v6e-1, ... (repeatable)")
    p.add_argument("--video", default="129,720,1280", help="frames,height,width of the video (default 129,720,1280)")
    p.add_argument("--channels", type=int, default=512, help="the middle block's channels (1.0: 512; 1.5: 1024)")
    p.add_argument("--spatial", type=int, default=8, help="spatial compression (1.0: 8; 1.5: 16)")
    p.add_argument("--temporal", type=int, default=4, help="temporal compression (4 for both)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--json", action="store_true", help="one JSON object per target")
    return p


def upstream_bytes(tokens: int, itemsize: int) -> dict[str, int]:
    """What upstream's untiled attention holds beside q, k and v: its mask, and the math path's scores and weights."""
    square = tokens * tokens * itemsize
    return {"mask": square, "mask_scores_weights": 3 * square}


def compile_one(target: str, tokens: int, frame_tokens: int, channels: int, dtype: str) -> dict[str, float | int]:
    """Compiles the blockwise attention at ``(1, tokens, channels)`` for one device of ``target``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from cogvideox_torchax.kernels.frame_causal_attention import frame_causal_attention
    from cogvideox_torchax.platforms import accelerators

    mesh = accelerators.target_mesh(target, "dp=1,tp=1")
    where = NamedSharding(mesh, PartitionSpec())
    spec = jax.ShapeDtypeStruct((1, 1, tokens, channels), jnp.dtype(dtype), sharding=where)
    start = time.perf_counter()
    compiled = jax.jit(lambda q, k, v: frame_causal_attention(q, k, v, frame_tokens=frame_tokens)).trace(
        spec, spec, spec).lower().compile()
    memory = compiled.memory_analysis()
    return {"compile_s": round(time.perf_counter() - start, 1), "temp": int(memory.temp_size_in_bytes),
            "arguments": int(memory.argument_size_in_bytes), "output": int(memory.output_size_in_bytes)}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import jax.numpy as jnp

    from cogvideox_torchax.platforms import accelerators

    accelerators.use_cpu_without_accelerators()
    frames, height, width = (int(v) for v in args.video.split(","))
    latent = (1 + (frames - 1) // args.temporal, height // args.spatial, width // args.spatial)
    tokens, frame_tokens = latent[0] * latent[1] * latent[2], latent[1] * latent[2]
    theirs = upstream_bytes(tokens, jnp.dtype(args.dtype).itemsize)
    for target in args.target:
        row = {"target": target, "video": args.video, "latent": list(latent), "tokens": tokens,
               "channels": args.channels, "dtype": args.dtype, **compile_one(target, tokens, frame_tokens,
                                                                             args.channels, args.dtype),
               "upstream_mask": theirs["mask"], "upstream_mask_scores_weights": theirs["mask_scores_weights"]}
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{target}: {tokens:,} tokens ({'x'.join(map(str, latent))} latents) x {args.channels} channels, "
                  f"{args.dtype}: ours temp {row['temp'] / 2**20:.2f} MiB (q, k, v {row['arguments'] / GIB:.2f} GiB, "
                  f"out {row['output'] / GIB:.2f} GiB), compiled in {row['compile_s']} s; upstream's mask "
                  f"{theirs['mask'] / GIB:,.1f} GiB, with the math path's scores and weights "
                  f"{theirs['mask_scores_weights'] / GIB:,.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
