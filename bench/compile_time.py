"""``python -m bench.compile_time``: compile time against video length, scanned and unrolled.

Upstream decodes latent frames in a Python loop (CogVideoX: batches of 2;
Wan: one frame at a time); traced into one jit, the loop unrolls and the
program grows with every batch. With the family's frame scan
(`cogvideox_torchax.families.cogvideox.patches.frame_scan`, Wan's
``wan_frame_scan``) the batches after the first are one scan step each, so
the program (and its compile time) should not grow::

    python -m bench.compile_time --model random:cogvideox-2b --frames 3,5,9,13,21,41 --hw 8,8
    python -m bench.compile_time --model random:wan2.1 --frames 9,41 --hw 8,8 --modes scanned

The unrolled mode turns the family's own ``loops`` switches off
(`bench.inputs.loop_switches`): upstream's loops, traced. ``--encode`` does
the same for the encode (upstream's batches of 8 video frames; Wan's first
frame, then 4 at a time), with video frame counts and sizes::

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
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET or a local diffusers VAE folder")
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


def tile_count(upstream, shape: tuple[int, ...]) -> tuple[int, set[tuple[int, int]]]:
    """How many tiles, of which latent sizes, upstream's tiled decode of ``shape`` makes (default tiles).

    Counted on a meta-device twin (shapes only): the decoder's calls over
    the family's frame batches per tile, and the sizes its inputs have.
    """
    import torch

    from bench.flops import meta_twin
    from bench.inputs import decode_args, family

    twin = meta_twin(upstream)
    twin.enable_tiling()
    sizes: list[tuple[int, int]] = []
    hook = twin.decoder.register_forward_pre_hook(lambda m, a: sizes.append(tuple(a[0].shape[-2:])))
    try:
        with torch.no_grad():
            z = torch.empty(shape, device="meta")
            twin.decode(z, *decode_args(twin, z))
    finally:
        hook.remove()
    batches = len(family(upstream).stream_batches(twin, shape[2]))
    return len(sizes) // batches, set(sizes)


def tiled(args) -> int:
    """Tiles, tile shapes and program size of one tiled decode, batched vs upstream's per-tile loop."""
    import jax

    import cogvideox_torchax as ct
    from bench.inputs import family, latent_channels, load_upstream, loop_switches

    upstream = load_upstream(args.model, seed=0)
    # The family's own tile batching: its loops-stage switch that batches tiles.
    switches = [s for s in loop_switches(family(upstream).name) if "tile" in s]
    if not switches:
        raise SystemExit(f"error: --tiled-hw: no tile-batching switch patches {family(upstream).title}")
    h, w = (int(v) for v in args.tiled_hw.split(","))
    t = int(args.frames.split(",")[0])
    shape = (1, latent_channels(upstream), t, h, w)
    tiles, shapes = tile_count(upstream, shape)
    print(f"# python -m bench.compile_time {' '.join(sys.argv[1:])}")
    print(f"# {args.model}, latents {shape}, {args.dtype}, {jax.devices()[0].device_kind}, default tiles")
    print(f"| tile batching ({switches[0]}) | tiles | tile shapes | compiled programs | program lines | trace+lower s "
          "| compile s |")
    print("|---|---|---|---|---|---|---|")
    for batching in (True, False):
        options = ct.RuntimeOptions(dtype=args.dtype, **{switches[0]: batching})
        vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=options)
        vae.enable_tiling()
        t0 = time.perf_counter()
        lowered = vae.lower_decode(shape)
        t1 = time.perf_counter()
        lowered.compile(compiler_options=vae.compiler_options)
        t2 = time.perf_counter()
        lines = len(lowered.as_text().splitlines())
        # The whole tiled decode is one jitted program either way; what
        # differs is how many decoders it holds (one per tile shape vs tile).
        print(
            f"| {'on' if batching else 'off'} | {tiles} | {len(shapes)} | 1 | {lines} "
            f"| {t1 - t0:.1f} | {t2 - t1:.1f} |"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import jax

    import cogvideox_torchax as ct

    jax.config.update("jax_enable_compilation_cache", False)
    from bench.inputs import family, latent_channels, load_upstream, unrolled_options, video_channels

    if args.tiled_hw:
        return tiled(args)
    upstream = load_upstream(args.model, seed=0)
    channels = latent_channels(upstream)
    h, w = (int(v) for v in args.hw.split(","))
    frames = [int(v) for v in args.frames.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    rows = []
    for mode in modes:
        if mode not in ("scanned", "unrolled"):
            raise SystemExit(f"error: --modes takes scanned and/or unrolled, got {mode!r}")
        if mode == "scanned":
            options = ct.RuntimeOptions(dtype=args.dtype)
        else:
            options = unrolled_options(args.dtype, family(upstream).name)
        vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=options)
        for t in frames:
            shape = (1, video_channels(upstream) if args.encode else channels, t, h, w)
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
    first_channels = video_channels(upstream) if args.encode else channels
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
