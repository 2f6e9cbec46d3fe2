"""``python -m cogvideox_torchax.decode LATENTS``: decode latents to a video.

A thin command line over the library. Latents come from a safetensors file,
in ``(B, C, T, H, W)`` (as ``vae.decode`` takes them) or ``(B, T, C, H, W)``
(as ``CogVideoXPipeline(output_type="latent")`` returns them), and are
divided by the model's scaling factor unless ``--no-unscale``. The video is
written as H.264 ``.mp4``, a folder of PNG frames (an output name without a
suffix), or raw float frames (``.npy`` / ``.safetensors``); one output per
video of the batch, all written under temporary names and moved in together
at the end. Bad input is one line on stderr, exit code 2, and no output
file; the exit codes are listed in ``--help``.

Many latents in one run: ``decode a.safetensors b.safetensors ... --output-dir
out/`` (folders and glob patterns too) loads the model once, compiles once
per latent shape, decodes equal shapes ``--batch-size`` at a time, and
writes ``out/a.mp4``, ... (each atomically) as they complete; a bad input is
reported and skipped, and ``--skip-existing`` resumes an interrupted run.
Under jax.distributed (``--coordinator``/``--distributed``) every process
runs the same command; process 0 reads, writes and reports.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from cogvideox_torchax import _cli
from cogvideox_torchax._cli import (
    Stage,
    UsageError,
    add_distributed_arguments,
    add_model_arguments,
    add_run_arguments,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cogvideox_torchax.decode",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog=_cli.EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "latents",
        nargs="+",
        help="safetensors file holding the latents; with --output-dir, any number of files, folders "
        "(their *.safetensors) and glob patterns",
    )
    p.add_argument("--key", help="tensor to decode when the file holds several")
    p.add_argument(
        "--layout",
        default="auto",
        choices=("auto", "BCTHW", "BTCHW"),
        help="latent layout; auto detects it from the model's latent channel count",
    )
    p.add_argument(
        "--no-unscale",
        dest="unscale",
        action="store_false",
        help="latents are already divided by config.scaling_factor (default: divide, as the pipeline does)",
    )
    add_model_arguments(p)
    out = p.add_mutually_exclusive_group()  # one is needed unless --dry-run (_check_args)
    out.add_argument(
        "--output",
        "-o",
        help="out.mp4, out.npy, out.safetensors, or a folder name for PNG frames; batch > 1 writes out_0.mp4, ...",
    )
    out.add_argument(
        "--output-dir",
        metavar="DIR",
        help="decode every input into DIR, one output per video named after its file (a.safetensors -> a.mp4; "
        "a file of B > 1 videos -> a_0.mp4, ...); DIR is made if missing",
    )
    p.add_argument(
        "--format",
        default=None,
        choices=("mp4", "png", "npy", "safetensors"),
        help="with --output-dir: what to write (default mp4; png writes a folder of frames per video)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="with --output-dir: videos of one latent shape decoded together (default: the mesh's dp)",
    )
    p.add_argument(
        "--skip-existing",
        action="store_true",
        help="with --output-dir: leave outputs that exist alone and decode the rest (resumes a run)",
    )
    p.add_argument("--fps", type=float, default=8.0, help="mp4 frame rate (default 8, as CogVideoX-2b)")
    p.add_argument("--crf", type=int, default=18, help="H.264 quality, 0 (lossless) to 51 (default 18)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing outputs: files, or folders holding only frame_*.png (never anything else)",
    )
    add_run_arguments(p)
    add_distributed_arguments(p)
    return p


def _check_args(args: argparse.Namespace) -> None:
    _cli.check_dtype(args)
    _cli.check_max_memory(args)
    if not args.fps > 0:
        raise UsageError(f"--fps must be positive, got {args.fps}")
    if not 0 <= args.crf <= 51:
        raise UsageError(f"--crf must be between 0 and 51, got {args.crf}")
    if args.output is None and args.output_dir is None and not args.dry_run:
        raise UsageError("one of --output/-o or --output-dir is needed (only --dry-run goes without)")
    if args.output_dir is None:
        if len(args.latents) > 1:
            raise UsageError(f"{len(args.latents)} latents inputs need --output-dir (--output names one video)")
        for flag, value in (
            ("--batch-size", args.batch_size),
            ("--skip-existing", args.skip_existing or None),
            ("--format", args.format),
        ):
            if value is not None:
                hint = " (--output's extension says what to write)" if flag == "--format" else ""
                raise UsageError(f"{flag} goes with --output-dir{hint}")
    else:
        args.format = args.format or "mp4"
        if args.batch_size is not None and args.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
        if args.skip_existing and args.overwrite:
            raise UsageError("--skip-existing and --overwrite contradict each other; pick one")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Decodes as the parsed arguments say and returns the summary."""
    _check_args(args)
    if args.output_dir is not None:
        from cogvideox_torchax import decode_many

        return decode_many.run(args)
    return _run_one(args)


def _run_one(args: argparse.Namespace) -> dict[str, Any]:
    from cogvideox_torchax import distributed, latents, memory, video

    show_memory = args.memory_report or memory.enabled_by_env()
    kind = video.output_kind(args.output) if args.output is not None else None
    z = None
    with _cli.together("reading the latents"):
        if _cli.is_primary():
            z = latents.read_latents(args.latents[0], args.key)
            latents.check_shape(z.shape)
    z = distributed.share_array(z)
    if args.dry_run:
        return _dry_run(args, z, show_memory)
    outputs = video.output_paths(Path(args.output), z.shape[0])
    # Every output path is checked, and its temporary entry made (the
    # writability probe), before anything expensive; on process 0 only.
    staged = None
    with _cli.together("checking the outputs"):
        if _cli.is_primary():
            staged = video.StagedOutputs(outputs, overwrite=args.overwrite)
    with staged if staged is not None else contextlib.nullcontext():
        return _decode(args, z, kind, staged, show_memory)


def _dry_run(args: argparse.Namespace, z, show_memory: bool) -> dict[str, Any]:
    """Loads the model and plans the decode's memory (compiling, not running); writes nothing."""
    from cogvideox_torchax import latents

    _, vae, load = _cli.load_together(args, show_memory)
    z, layout = latents.prepare(
        z, vae.config.latent_channels, vae.config.scaling_factor, layout=args.layout, unscale=args.unscale
    )
    vae.check_latents(z.shape)
    return {**_cli.plan_stage(vae, z.shape, "decode", args, load), "latents_shape": list(z.shape), "layout": layout}


def _decode(args: argparse.Namespace, z, kind: str, staged, show_memory: bool) -> dict[str, Any]:
    import jax
    import numpy as np

    from cogvideox_torchax import latents, memory, video

    from cogvideox_torchax import distributed

    cache_dir, vae, load = _cli.load_together(args, show_memory)
    config = vae.config
    z, layout = latents.prepare(
        z, config.latent_channels, config.scaling_factor, layout=args.layout, unscale=args.unscale
    )
    vae.check_latents(z.shape)
    latents.check_range(z, vae.options.dtype, unscaled_by=float(config.scaling_factor) if args.unscale else None)

    # mp4 and PNG take uint8 frames, made on device (a quarter of the fp32
    # output crosses to the host); raw outputs take the decoder's floats.
    on_device_frames = kind not in ("npy", "safetensors")
    program = "frames" if on_device_frames else "decode"
    batch, frames_per_video = z.shape[0], _frame_count(z.shape[2])

    def decode_all():
        with Stage("decode", batch * frames_per_video, "frame", args.quiet) as decode:
            # One compiled program decodes the whole batch; the bar completes
            # when it returns.
            if on_device_frames:
                out = jax.block_until_ready(vae.decode_frames_jax(z))
            else:
                out = (jax.block_until_ready(vae.decode_jax(z)), None)
            decode.tick(batch * frames_per_video)
        return decode, out

    # Compiled, then run, each agreed by every process (a process whose
    # compile failed must not leave the others inside the program).
    with _cli.together("compiling and decoding"):
        compile_stage, cache_events = _cli.retry_out_of_memory(
            args, vae, z.shape, program, "compiling the decode of",
            lambda: _cli.compile_stage(
                lambda shape: vae.compile_decode(shape, frames=on_device_frames), z.shape, args, show_memory
            ),
        )
        decode, (decoded, finite) = _cli.retry_out_of_memory(
            args, vae, z.shape, program, "decoding latents of", decode_all
        )
    if show_memory:
        memory.report("decode")
    # Every process takes part in gathering; only process 0 writes.
    if on_device_frames:
        host = distributed.to_host(decoded)
        if not bool(distributed.to_host(finite).all()):
            raise UsageError(_cli.nonfinite_cause(vae, "decode", float(np.abs(z).max())))
    else:
        host = distributed.to_host(decoded.astype(jax.numpy.float32))
    del decoded
    if not on_device_frames:
        _cli.check_finite(host, vae, "decode", float(np.abs(z).max()))

    per_video = 1 if kind in ("npy", "safetensors") else frames_per_video
    with _cli.together("writing the outputs"):
        with Stage("write", batch * per_video, "frame" if per_video > 1 else "file", args.quiet) as write:
            if staged is not None:
                for tmp, one in zip(staged.temps, host, strict=True):
                    video.write_video_to(tmp, kind, one, fps=args.fps, crf=args.crf, tick=write.tick)
        if show_memory:
            memory.report("write")
        _cli.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
    # Moved in only once every process has come through the step.
    with _cli.together("moving the outputs in"):
        if staged is not None:
            staged.commit()
    outputs = video.output_paths(Path(args.output), batch)

    return {
        "outputs": [str(p) for p in outputs],
        "kind": kind,
        "latents_shape": list(z.shape),
        "layout": layout,
        "unscaled": bool(args.unscale),
        "video_shape": [host.shape[i] for i in (0, 4, 1, 2, 3)] if on_device_frames else list(host.shape),
        "memory_plan": vae.planned(tuple(z.shape), kind=program).as_dict(),
        "dtype": vae.options.dtype,
        "mesh": dict(vae.mesh.shape),
        "processes": jax.process_count(),
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "plan": vae.plan.as_dict(),
        "load_s": round(load.seconds, 3),
        "compile_s": round(compile_stage.seconds, 3),
        "compile_cache": cache_events.status if cache_dir else "off",
        "compile_cache_dir": str(cache_dir) if cache_dir else None,
        "decode_s": round(decode.seconds, 3),
        "write_s": round(write.seconds, 3),
        "frames_per_s": round(batch * frames_per_video / decode.seconds, 3),
    }


def _frame_count(latent_frames: int) -> int:
    # Upstream's decoder turns 1 latent frame into 1, each later pair into 8,
    # and a leading odd batch of 3 into 9: 1 -> 1, even T -> 4T, odd T -> 4T-3.
    if latent_frames == 1:
        return 1
    return 4 * latent_frames if latent_frames % 2 == 0 else 4 * latent_frames - 3


def _print_summary(s: dict[str, Any]) -> None:
    if s.get("many"):
        from cogvideox_torchax import decode_many

        decode_many.print_summary(s)
        return
    plan = s["memory_plan"]
    if s.get("dry_run"):
        print(
            f"plan for {s['latents_shape']} ({s['dtype']}, mesh {s['mesh']}): {plan['name']}, "
            f"{plan['bytes'] / 2**30:.2f} GiB per device of {plan['budget'] / 2**30:.2f} GiB usable; nothing run"
        )
        _cli.print_target(s)
        return
    print(
        f"decoded {s['latents_shape']} ({s['layout']}, {'unscaled' if s['unscaled'] else 'as given'}) -> "
        f"{s['video_shape']} ({s['dtype']}, mesh {s['mesh']}, {s['device']})"
    )
    print(
        f"  load {s['load_s']:.2f} s | compile {s['compile_s']:.2f} s (cache {s['compile_cache']}) | "
        f"decode {s['decode_s']:.2f} s ({s['frames_per_s']:.2f} frames/s) | write {s['write_s']:.2f} s"
    )
    print(f"  memory plan: {plan['name']}, {plan['bytes'] / 2**30:.2f} GiB per device")
    for path in s["outputs"]:
        print(f"  wrote {path}")


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0 ok, 1 error, 2 bad input, 3 out of memory, 130 interrupted)."""
    return _cli.command(_parser, argv, run, _print_summary)


if __name__ == "__main__":
    sys.exit(main())
