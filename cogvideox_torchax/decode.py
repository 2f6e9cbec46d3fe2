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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cogvideox_torchax import _cli
from cogvideox_torchax._cli import Stage, UsageError, add_model_arguments, add_run_arguments


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cogvideox_torchax.decode",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog=_cli.EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("latents", help="safetensors file holding the latents")
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
    p.add_argument(
        "--output",
        "-o",
        required=True,
        help="out.mp4, out.npy, out.safetensors, or a folder name for PNG frames; batch > 1 writes out_0.mp4, ...",
    )
    p.add_argument("--fps", type=float, default=8.0, help="mp4 frame rate (default 8, as CogVideoX-2b)")
    p.add_argument("--crf", type=int, default=18, help="H.264 quality, 0 (lossless) to 51 (default 18)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing outputs: files, or folders holding only frame_*.png (never anything else)",
    )
    add_run_arguments(p)
    return p


def _check_args(args: argparse.Namespace) -> None:
    _cli.check_dtype(args)
    _cli.check_max_memory(args)
    if not args.fps > 0:
        raise UsageError(f"--fps must be positive, got {args.fps}")
    if not 0 <= args.crf <= 51:
        raise UsageError(f"--crf must be between 0 and 51, got {args.crf}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Decodes as the parsed arguments say and returns the summary."""
    from cogvideox_torchax import latents, memory, video

    _check_args(args)
    show_memory = args.memory_report or memory.enabled_by_env()
    kind = video.output_kind(args.output)
    z = latents.read_latents(args.latents, args.key)
    latents.check_shape(z.shape)
    if args.dry_run:
        return _dry_run(args, z, show_memory)
    outputs = video.output_paths(Path(args.output), z.shape[0])
    # Every output path is checked, and its temporary entry made (the
    # writability probe), before anything expensive.
    with video.StagedOutputs(outputs, overwrite=args.overwrite) as staged:
        summary = _decode(args, z, kind, staged, show_memory)
        _cli.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
        staged.commit()
    return summary


def _dry_run(args: argparse.Namespace, z, show_memory: bool) -> dict[str, Any]:
    """Loads the model and plans the decode's memory (compiling, not running); writes nothing."""
    from cogvideox_torchax import latents

    _cli.compile_cache_from_args(args)
    vae, load = _cli.load_stage(args, show_memory)
    z, layout = latents.prepare(
        z, vae.config.latent_channels, vae.config.scaling_factor, layout=args.layout, unscale=args.unscale
    )
    vae.check_latents(z.shape)
    return {**_cli.plan_stage(vae, z.shape, "decode", args, load), "latents_shape": list(z.shape), "layout": layout}


def _decode(args: argparse.Namespace, z, kind: str, staged, show_memory: bool) -> dict[str, Any]:
    import jax
    import numpy as np

    from cogvideox_torchax import latents, memory, video

    cache_dir = _cli.compile_cache_from_args(args)
    vae, load = _cli.load_stage(args, show_memory)
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
    with _cli.out_of_memory_as_exit_3("compiling the decode of latents", z.shape, vae):
        compile_stage, cache_events = _cli.compile_stage(
            lambda shape: vae.compile_decode(shape, frames=on_device_frames), z.shape, args, show_memory
        )

    batch, frames_per_video = z.shape[0], _frame_count(z.shape[2])
    with _cli.out_of_memory_as_exit_3("decoding latents", z.shape, vae):
        with Stage("decode", batch * frames_per_video, "frame", args.quiet) as decode:
            # One compiled program decodes the whole batch; the bar completes
            # when it returns.
            if on_device_frames:
                decoded, finite = jax.block_until_ready(vae.decode_frames_jax(z))
            else:
                decoded = jax.block_until_ready(vae.decode_jax(z))
            decode.tick(batch * frames_per_video)
        if show_memory:
            memory.report("decode")
        if on_device_frames:
            host = np.asarray(decoded)
            if not bool(np.asarray(finite).all()):
                raise UsageError(_cli.nonfinite_cause(vae, "decode", float(np.abs(z).max())))
        else:
            host = np.asarray(decoded.astype(jax.numpy.float32))
        del decoded
    if not on_device_frames:
        _cli.check_finite(host, vae, "decode", float(np.abs(z).max()))

    per_video = 1 if kind in ("npy", "safetensors") else frames_per_video
    with Stage("write", batch * per_video, "frame" if per_video > 1 else "file", args.quiet) as write:
        for tmp, one in zip(staged.temps, host, strict=True):
            video.write_video_to(tmp, kind, one, fps=args.fps, crf=args.crf, tick=write.tick)
    if show_memory:
        memory.report("write")
    outputs = staged.paths

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
    plan = s["memory_plan"]
    if s.get("dry_run"):
        print(
            f"plan for {s['latents_shape']} ({s['dtype']}, mesh {s['mesh']}): {plan['name']}, "
            f"{plan['bytes'] / 2**30:.2f} GiB per device of {plan['budget'] / 2**30:.2f} GiB usable; nothing run"
        )
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
