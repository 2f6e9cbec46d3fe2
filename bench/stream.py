"""``python -m bench.stream``: latents to an mp4, end to end: decode then write, streamed, and upstream torch.

Three ways to the same video, each after one untimed run (compiles)::

    python -m bench.stream --model random:cogvideox-2b --shape 3,8,8 --shape 7,8,8 --shape 13,8,8

- ``whole``: ours, `decode_frames_jax` then the frames to the host, then
  libx264 (the ``--no-stream`` path of the decode command);
- ``streamed``: ours, `decode_stream` with the writer on a thread (the
  decode command's default), with the time to the first frame;
- ``torch``: upstream's eager decode, diffusers' uint8 mapping, libx264;
  on the GPU in the run's dtype where torch sees one (JAX's preallocation
  then off, as in `bench.decode`), else on the CPU in fp32 (the row's
  ``device`` and ``dtype`` say which).

``--writer`` instead measures libx264 alone: frames per second on one
thread (``threads=1``: per core) and on every core, for smooth and noisy
frames, at ``--sizes`` and ``--presets``, crf ``--crf``.

``--stand-in FPS`` puts a stand-in device before the decode command's
writer: textured frames yielded in CogVideoX's batches at a set speed
(`bench.stand_in`), so the writer's share of the end-to-end time is
measured without a device, for each writer setting of
`bench.writer_settings` and each count of cores::

    python -m bench.stream --stand-in 4x,0.5x --settings default,before --cores 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import stand_in

FRAME_SIZES = {"480x720": (480, 720), "768x1360": (768, 1360)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:cogvideox-2b", help="random:PRESET or a local diffusers VAE folder")
    p.add_argument("--shape", action="append", help="latent T,H,W (batch 1); repeatable")
    p.add_argument("--systems", default="whole,streamed,torch", help="comma list of whole, streamed, torch")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per system and shape (median kept)")
    p.add_argument("--crf", type=int, default=18)
    p.add_argument("--preset", default=None, help="libx264 preset of the end-to-end runs (its default: medium)")
    p.add_argument("--writer", action="store_true", help="measure libx264 alone instead")
    p.add_argument("--sizes", default="480x720,768x1360", help="--writer: frame sizes")
    p.add_argument("--presets", default="ultrafast,veryfast,medium", help="--writer: libx264 presets")
    p.add_argument("--frames", type=int, default=24, help="--writer: frames per measurement")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="PNG", help="draw end-to-end (and first-frame) time against frames")
    p.add_argument("--from-json", metavar="FILE", help="with --plot: draw an earlier --json run instead of running")
    stand_in.add_arguments(p)
    return p


# -- the writer alone ---------------------------------------------------------


def _frames(kind: str, count: int, height: int, width: int):
    """Smooth (gradients that move) or noisy (uniform noise: the worst case) uint8 frames."""
    import numpy as np

    if kind == "noisy":
        return np.random.default_rng(0).integers(0, 256, (count, height, width, 3), dtype=np.uint8)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((count, height, width, 3), np.uint8)
    for i in range(count):
        out[i, ..., 0] = (x + 4 * i) % 256
        out[i, ..., 1] = (y + 2 * i) % 256
        out[i, ..., 2] = ((x + y) / 2 + 3 * i) % 256
    return out


def _encode_seconds(frames, crf: int, preset: str, threads: str) -> float:
    import av

    from cogvideox_torchax.io.video import _fraction

    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        with av.open(str(Path(d) / "v.mp4"), mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=_fraction(8))
            stream.height, stream.width = frames.shape[1:3]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf), "preset": preset, "threads": threads}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        return time.perf_counter() - start


def writer_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    for size in args.sizes.split(","):
        height, width = FRAME_SIZES.get(size) or tuple(int(v) for v in size.split("x"))
        for content in ("smooth", "noisy"):
            frames = _frames(content, args.frames, height, width)
            for preset in args.presets.split(","):
                one = _encode_seconds(frames, args.crf, preset, "1")
                every = _encode_seconds(frames, args.crf, preset, "0")
                rows.append({
                    "size": f"{height}x{width}", "content": content, "preset": preset, "crf": args.crf,
                    "frames": args.frames, "fps_one_thread": round(args.frames / one, 2),
                    "fps_all_threads": round(args.frames / every, 2), "cores": os.cpu_count(),
                })
    return rows


# -- end to end ---------------------------------------------------------------


def _ours(upstream, dtype: str):
    import cogvideox_torchax as ct

    return ct.wrap(upstream, dtype=dtype, mesh="dp=1,tp=1")


def _whole(vae, z, dest: Path, crf: int, preset: str | None) -> dict:
    import jax
    import numpy as np

    from cogvideox_torchax.io.video import FrameWriter

    start = time.perf_counter()
    frames, _ = vae.decode_frames_jax(z)
    host = np.asarray(jax.device_get(frames))
    decoded = time.perf_counter() - start
    with FrameWriter(dest, "mp4", crf=crf, preset=preset) as writer:
        writer.write(host[0])
    end = time.perf_counter() - start
    return {"first_frame_s": decoded, "decode_s": decoded, "write_s": end - decoded, "end_to_end_s": end}


def _streamed(vae, z, dest: Path, crf: int, preset: str | None) -> dict:
    from cogvideox_torchax.io.video import FrameWriter
    from cogvideox_torchax.io.writer import write_while_decoding

    times = write_while_decoding(vae.decode_stream(z), lambda i: FrameWriter(dest, "mp4", crf=crf, preset=preset), 1)
    return {**times.as_dict(), "write_hidden": times.write_hidden}


def torch_placement(dtype: str) -> tuple[str, str]:
    """Where the ``torch`` row decodes: ``("cuda", dtype)`` where torch sees a GPU, else ``("cpu", "float32")``."""
    import torch

    from cogvideox_torchax.config import canonical_dtype

    return ("cuda", canonical_dtype(dtype)) if torch.cuda.is_available() else ("cpu", "float32")


def _torch(upstream, z, dest: Path, crf: int, preset: str | None) -> dict:
    import torch

    from bench.inputs import decode_args
    from cogvideox_torchax.io.video import FrameWriter, to_uint8

    start = time.perf_counter()
    with torch.no_grad():
        video = upstream.decode(z, *decode_args(upstream, z)).sample
    frames = to_uint8(video.float().cpu().numpy())  # the copy to the host waits for the GPU
    decoded = time.perf_counter() - start
    with FrameWriter(dest, "mp4", crf=crf, preset=preset) as writer:
        writer.write(frames[0])
    end = time.perf_counter() - start
    return {"first_frame_s": decoded, "decode_s": decoded, "write_s": end - decoded, "end_to_end_s": end}


def end_to_end_rows(args: argparse.Namespace) -> list[dict]:
    import numpy as np
    import torch

    from bench import inputs

    upstream = inputs.load_upstream(args.model, 0)
    channels = inputs.latent_channels(upstream)
    family = inputs.family(upstream)
    systems = args.systems.split(",")
    vae = _ours(upstream, args.dtype) if {"whole", "streamed"} & set(systems) else None
    if "torch" in systems:
        torch_device, torch_dtype = torch_placement(args.dtype)
        module = upstream  # the CPU: today's fp32 module; the GPU: a copy of its own there
        if torch_device != "cpu":
            module = inputs.load_upstream(args.model, 0).to(device=torch_device, dtype=getattr(torch, torch_dtype))
    rows = []
    for text in args.shape or ["3,8,8"]:
        t, h, w = (int(v) for v in text.split(","))
        z_torch = inputs.latents((1, channels, t, h, w), 0)
        z = z_torch.numpy().astype(np.float32)
        for system in systems:
            def run(dest: Path, system=system, z=z, z_torch=z_torch) -> dict:
                if system == "torch":
                    zt = z_torch.to(device=torch_device, dtype=getattr(torch, torch_dtype))
                    return _torch(module, zt, dest, args.crf, args.preset)
                return (_whole if system == "whole" else _streamed)(vae, z, dest, args.crf, args.preset)

            with tempfile.TemporaryDirectory() as d:
                run(Path(d) / "warm.mp4")  # compiles (ours); warms the allocator (torch)
                timed = [run(Path(d) / f"{i}.mp4") for i in range(args.repeats)]
            keys = timed[0].keys()
            row = {k: round(statistics.median(r[k] for r in timed), 3) for k in keys}
            frames = family.frames_of(upstream.config, t)
            where = {"device": torch_device, "dtype": torch_dtype} if system == "torch" else {}
            rows.append({"system": system, "shape": [1, channels, t, h, w], "frames": frames, **row, **where})
    return rows


def plot(report: dict, path: str) -> None:
    """End-to-end time per system against the video's frame count; the streamed run's first frame dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for system in dict.fromkeys(r["system"] for r in report["rows"]):
        rows = sorted((r for r in report["rows"] if r["system"] == system), key=lambda r: r["frames"])
        frames = [r["frames"] for r in rows]
        ax.plot(frames, [r["end_to_end_s"] for r in rows], marker="o", label=f"{system}: end to end")
        if system == "streamed":
            ax.plot(frames, [r["first_frame_s"] for r in rows], marker="x", linestyle="--",
                    label="streamed: first frame on the host")
    shape = report["rows"][0]["shape"]
    ax.set_xlabel(f"video frames (latents 1x{shape[1]}xTx{shape[3]}x{shape[4]})")
    ax.set_ylabel("seconds")
    ax.set_title(f"latents -> mp4, {report['model']}, {report['dtype']}, crf {report['crf']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.from_json:
        if not args.plot:
            raise SystemExit("error: --from-json goes with --plot")
        plot(json.loads(Path(args.from_json).read_text()), args.plot)
        return
    if args.stand_in:
        report = {"command": "python -m bench.stream " + " ".join(argv), **stand_in.environment(), **stand_in.run(args)}
        if args.json:
            print(json.dumps(report))
        else:
            stand_in.print_report(report)
        return
    if args.writer:
        rows = writer_rows(args)
        if args.json:
            print(json.dumps({"writer": rows}))
            return
        print("size       content  preset     fps/1 thread  fps/all threads")
        for r in rows:
            print(f"{r['size']:<10} {r['content']:<8} {r['preset']:<10} {r['fps_one_thread']:>12.2f}  "
                  f"{r['fps_all_threads']:>15.2f}")
        return
    import importlib.metadata as md

    if "torch" in args.systems.split(","):
        # As in bench.decode: JAX would take 75 % of a GPU up front, leaving eager torch a quarter.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    rows = end_to_end_rows(args)
    import jax

    versions = {p: md.version(p) for p in ("jax", "torch", "av")}
    device = f"{jax.devices()[0].device_kind} x{len(jax.devices())} ({jax.default_backend()})"
    report = {"command": "python -m bench.stream " + " ".join(argv), "device": device, "model": args.model,
              "dtype": args.dtype, "crf": args.crf, "preset": args.preset, "versions": versions, "rows": rows}
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print(json.dumps(report))
        return
    print("system    latents          frames  first frame s  decode s  write s  end to end s")
    for r in rows:
        print(f"{r['system']:<9} {str(tuple(r['shape'])):<16} {r['frames']:>6} {r['first_frame_s']:>14.2f} "
              f"{r['decode_s']:>9.2f} {r['write_s']:>8.2f} {r['end_to_end_s']:>13.2f}")


if __name__ == "__main__":
    main()
