"""``python -m bench.compile_time``: compile time against video length, scanned and unrolled.

Upstream decodes latent frames in batches of 2 in a Python loop; traced into
one jit, the loop unrolls and the program grows with every batch. With
`cogvideox_torchax.patches.frame_scan` the batches after the first are one scan
step each, so the program (and its compile time) should not grow::

    python -m bench.compile_time --model random:cogvideox-2b --frames 3,5,9,13,21,41 --hw 8,8

``--encode`` does the same for the encode (upstream's batches of 8 video
frames), with video frame counts and sizes::

    python -m bench.compile_time --encode --frames 9,49 --hw 480,720 --modes scanned

Prints, per frame count and mode, the trace + lower time, the XLA compile
time, the lowered program's size in lines and the compiled temporary bytes.
Compilation runs with the persistent cache off, so every figure is a real
compile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.compile_time", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET")
    p.add_argument("--frames", default="3,5,9,13,21,41", help="latent frame counts")
    p.add_argument("--hw", default="8,8", help="latent height,width")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--modes", default="scanned,unrolled", help="scanned and/or unrolled")
    p.add_argument(
        "--tiled-hw",
        default=None,
        metavar="H,W",
        help="instead: a tiled decode of latents H x W with upstream's default 240x360 tiles, batched vs per tile",
    )
    p.add_argument(
        "--encode",
        action="store_true",
        help="time the encode instead: --frames are video frame counts and --hw the video's height,width",
    )
    p.add_argument("--json", action="store_true")
    return p


def tiled(args) -> int:
    """Tiles, tile shapes and program size of one tiled decode, batched vs upstream's per-tile loop."""
    import jax

    import cogvideox_torchax as ct

    upstream = ct.random_upstream(args.model.removeprefix("random:"))
    h, w = (int(v) for v in args.tiled_hw.split(","))
    t = int(args.frames.split(",")[0])
    shape = (1, upstream.config.latent_channels, t, h, w)
    print(f"# python -m bench.compile_time {' '.join(sys.argv[1:])}")
    print(f"# {args.model}, latents {shape}, {args.dtype}, {jax.devices()[0].device_kind}, default tiles")
    print("| tile batching | tiles | tile shapes | compiled programs | program lines | trace+lower s | compile s |")
    print("|---|---|---|---|---|---|---|")
    for batching in (True, False):
        vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(dtype=args.dtype, tile_batching=batching))
        vae.enable_tiling()
        m = vae.module
        step_h = int(m.tile_latent_min_height * (1 - m.tile_overlap_factor_height))
        step_w = int(m.tile_latent_min_width * (1 - m.tile_overlap_factor_width))
        starts = [(i, j) for i in range(0, h, step_h) for j in range(0, w, step_w)]
        shapes = {(min(m.tile_latent_min_height, h - i), min(m.tile_latent_min_width, w - j)) for i, j in starts}
        t0 = time.perf_counter()
        lowered = vae.lower_decode(shape)
        t1 = time.perf_counter()
        lowered.compile(compiler_options=vae.compiler_options)
        t2 = time.perf_counter()
        lines = len(lowered.as_text().splitlines())
        # The whole tiled decode is one jitted program either way; what
        # differs is how many decoders it holds (one per tile shape vs tile).
        print(
            f"| {'on' if batching else 'off'} | {len(starts)} | {len(shapes)} | 1 | {lines} "
            f"| {t1 - t0:.1f} | {t2 - t1:.1f} |"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import jax

    import cogvideox_torchax as ct

    jax.config.update("jax_enable_compilation_cache", False)
    if args.tiled_hw:
        return tiled(args)
    upstream = ct.random_upstream(args.model.removeprefix("random:"))
    channels = upstream.config.latent_channels
    h, w = (int(v) for v in args.hw.split(","))
    frames = [int(v) for v in args.frames.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    rows = []
    for mode in modes:
        options = ct.RuntimeOptions(dtype=args.dtype, frame_scan=(mode == "scanned"))
        vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=options)
        for t in frames:
            shape = (1, upstream.config.in_channels if args.encode else channels, t, h, w)
            t0 = time.perf_counter()
            lowered = vae.lower_encode(shape) if args.encode else vae.lower_decode(shape)
            t1 = time.perf_counter()
            compiled = lowered.compile(compiler_options=vae.compiler_options)
            t2 = time.perf_counter()
            mem = compiled.memory_analysis()
            row = {
                "mode": mode,
                "video_frames" if args.encode else "latent_frames": t,
                "trace_lower_s": round(t1 - t0, 2),
                "compile_s": round(t2 - t1, 2),
                "total_s": round(t2 - t0, 2),
                "program_lines": len(lowered.as_text().splitlines()),
                "temp_bytes": int(mem.temp_size_in_bytes) if mem else None,
            }
            rows.append(row)
            print(f"[compile_time] {row}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"command": "python -m bench.compile_time " + " ".join(sys.argv[1:]), "rows": rows}))
        return 0
    device = f"{jax.devices()[0].device_kind} ({jax.default_backend()})"
    what, key = ("video", "video_frames") if args.encode else ("latents", "latent_frames")
    first_channels = upstream.config.in_channels if args.encode else channels
    print(f"# python -m bench.compile_time {' '.join(sys.argv[1:])}")
    print(f"# {args.model}, {what} (1,{first_channels},T,{h},{w}), {args.dtype}, {device}, jax {jax.__version__}")
    print(f"| mode | {key.replace('_', ' ')} | trace+lower s | compile s | total s | program lines | temp MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        temp = "-" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 2**20:.0f}"
        print(
            f"| {r['mode']} | {r[key]} | {r['trace_lower_s']} | {r['compile_s']} | {r['total_s']} "
            f"| {r['program_lines']} | {temp} |"
        )
    shortest = min(frames)
    by_mode = {m: {r[key]: r for r in rows if r["mode"] == m} for m in modes}
    for mode, by_frames in by_mode.items():
        longest = max(by_frames)
        if longest > shortest:
            a, b = by_frames[shortest], by_frames[longest]
            ratio = f"{b['temp_bytes'] / a['temp_bytes']:.2f}x" if a["temp_bytes"] and b["temp_bytes"] else "-"
            print(
                f"# {mode}: {longest} frames take {b['total_s'] / a['total_s']:.2f}x the compile time and "
                f"{ratio} the temporary memory of {shortest}"
            )
    return 0

if __name__ == "__main__":
    sys.exit(main())
