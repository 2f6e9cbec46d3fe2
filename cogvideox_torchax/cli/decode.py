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
import time
from pathlib import Path
from typing import Any

from cogvideox_torchax.cli import agreement, command, errors, interrupts, options, out_of_memory, stages
from cogvideox_torchax.cli.decode_config import DecodeConfig
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.cli.options import add_model_arguments
from cogvideox_torchax.cli.stages import Stage


def _parser() -> argparse.ArgumentParser:
    p = options.Parser.for_command("decode", __doc__)
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
    out = p.add_mutually_exclusive_group()  # one is needed unless --dry-run (DecodeConfig.from_args)
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
        help="with --output-dir: videos of one latent shape decoded together, at least 1 (default: the mesh's dp)",
    )
    p.add_argument(
        "--skip-existing",
        action="store_true",
        help="with --output-dir: leave outputs that exist alone and decode the rest (resumes a run)",
    )
    p.add_argument("--fps", type=float, default=8.0, help="mp4 frame rate, 0.01 to 1000 (default 8, as CogVideoX-2b)")
    p.add_argument("--crf", type=int, default=18, help="H.264 quality, 0 (lossless) to 51 (default 18)")
    p.add_argument(
        "--encoder",
        default="libx264",
        help="mp4 encoder: libx264 (the CPU, default) or h264_nvenc (an NVIDIA GPU's NVENC, which H100 and H200 "
        "lack; refused where it cannot start)",
    )
    p.add_argument(
        "--preset",
        default=None,
        help="the encoder's speed preset: libx264 ultrafast ... veryslow (its default: medium), NVENC p1 ... p7",
    )
    p.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="decode the whole video, then write it (default for mp4 and PNG: write each batch of frames while "
        "the next decodes)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing outputs: files, or folders holding only frame_*.png (never anything else)",
    )
    return options.with_shared_arguments(p)


def run(config: DecodeConfig) -> dict[str, Any]:
    """Decodes as the configuration says and returns the summary."""
    if config.output_dir is not None:
        from cogvideox_torchax.cli import decode_many

        return decode_many.run(config)
    return _run_one(config)


def _run_one(config: DecodeConfig) -> dict[str, Any]:
    from cogvideox_torchax.io import latents, outputs
    from cogvideox_torchax.parallel import distributed

    kind = outputs.output_kind(config.output) if config.output is not None else None
    z = None
    with agreement.together("reading the latents"):
        if agreement.is_primary():
            z = latents.read_latents(config.latents[0], config.key)
            latents.check_shape(z.shape)
    z = distributed.share_array(z)
    paths = [] if config.output is None else outputs.output_paths(Path(config.output), z.shape[0])
    if config.run.dry_run:
        # As the run would: outputs it would refuse are refused now (exit 2), nothing made.
        with agreement.together("checking the outputs"):
            if agreement.is_primary():
                outputs.check_outputs(paths, overwrite=config.overwrite)
        return {**_dry_run(config, z, kind), "outputs": [str(p) for p in paths]}
    # Every output path is checked, and its temporary entry made (the
    # writability probe), before anything expensive; on process 0 only.
    staged = None
    with agreement.together("checking the outputs"):
        if agreement.is_primary():
            staged = outputs.StagedOutputs(paths, overwrite=config.overwrite)
    with staged if staged is not None else contextlib.nullcontext():
        return _decode(config, z, kind, staged)


def _dry_run(config: DecodeConfig, z, kind: str | None) -> dict[str, Any]:
    """Loads the model and plans the decode's memory as the run would (compiling, not running); writes nothing."""
    from cogvideox_torchax.cli import stream_choice
    from cogvideox_torchax.io import latents

    _, vae, load = stages.load_together(config.run)
    z, layout = latents.prepare_for(vae, z, layout=config.layout, unscale=config.unscale)
    shape, target = tuple(z.shape), config.run.model.target
    why = "no output named" if kind is None else stream_choice.why_not(config.stream, kind, vae, shape, target)
    streamed = []

    def streamed_plan():
        plan, _, why_not = stream_choice.streamed_plan(vae, shape)
        streamed.append(why_not)
        return plan

    # A --target report reads the decode program's compiled bytes and HLO (as the bench does).
    program = "frames" if kind in stream_choice.STREAMED_KINDS and target is None else "decode"
    summary = stages.plan_stage(vae, shape, program, config.run, load, None if why else streamed_plan)
    why = why or (streamed[0] if streamed else None)
    return {**summary, "latents_shape": list(shape), "layout": layout, "streamed": why is None, "stream_why_not": why}


def _decode(config: DecodeConfig, z, kind: str, staged) -> dict[str, Any]:
    import jax
    import numpy as np

    from cogvideox_torchax.cli import stream_choice
    from cogvideox_torchax.io import latents, outputs, video
    from cogvideox_torchax.memory import in_use
    from cogvideox_torchax.parallel import distributed

    cache_dir, vae, load = stages.load_together(config.run)
    z, layout = latents.prepare_for(vae, z, layout=config.layout, unscale=config.unscale)
    if kind == "mp4":
        video.check_mp4_size(*latents.frame_size(vae.config, z.shape))
    streamed, why_not_streamed = _stream_plan(config, vae, z, kind)
    if streamed is not None:
        try:
            with stream_choice.unless_auto(vae, "decoding latents of", z.shape):
                return _decode_streamed(
                    config, vae, z, kind, staged, streamed, layout=layout, load=load, cache_dir=cache_dir
                )
        except Exception as e:
            if isinstance(e, errors.OutOfMemory) or not out_of_memory.is_out_of_memory(e):
                raise
            # Under "auto", as the library's retry: once more, on the planner's plan.
            why_not_streamed = "the streamed decode ran out of memory"
            errors.say(f"out of memory while streaming latents of shape {tuple(z.shape)}; "
                       "decoding with the memory plan instead")
    started = time.perf_counter()

    # mp4 and PNG take uint8 frames, made on device (a quarter of the fp32
    # output crosses to the host); raw outputs take the decoder's floats.
    on_device_frames = kind not in ("npy", "safetensors")
    program = "frames" if on_device_frames else "decode"
    batch, frames_per_video = z.shape[0], _frame_count(z.shape[2])

    def decode_all():
        with Stage("decode", batch * frames_per_video, "frame", config.run.quiet) as decode:
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
    with agreement.together("compiling and decoding"):
        compile_stage, cache_events = out_of_memory.retry_out_of_memory(
            vae, z.shape, program, "compiling the decode of",
            lambda: stages.compile_stage(
                lambda shape: vae.compile_decode(shape, frames=on_device_frames), z.shape, config.run
            ),
            quiet=config.run.quiet,
        )
        decode, (decoded, finite) = out_of_memory.retry_out_of_memory(
            vae, z.shape, program, "decoding latents of", decode_all, quiet=config.run.quiet
        )
    if config.run.memory_report:
        in_use.report("decode")
    # Every process takes part in gathering; only process 0 writes.
    if on_device_frames:
        host = distributed.to_host(decoded)
        if not bool(distributed.to_host(finite).all()):
            raise UsageError(out_of_memory.nonfinite_cause(vae, "decode", float(np.abs(z).max())))
    else:
        host = distributed.to_host(decoded.astype(jax.numpy.float32))
    del decoded
    if not on_device_frames:
        out_of_memory.check_finite(host, vae, "decode", float(np.abs(z).max()))

    per_video = 1 if kind in ("npy", "safetensors") else frames_per_video
    with agreement.together("writing the outputs"):
        with Stage("write", batch * per_video, "frame" if per_video > 1 else "file", config.run.quiet) as write:
            if staged is not None:
                for path, tmp, one in zip(staged.paths, staged.temps, host, strict=True):
                    with outputs.disk_full_named(path, one.nbytes):
                        video.write_video_to(tmp, kind, one, fps=config.fps, crf=config.crf, tick=write.tick,
                                             encoder=config.encoder, preset=config.preset)
        if config.run.memory_report:
            in_use.report("write")
        interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
    # Moved in only once every process has come through the step.
    with agreement.together("moving the outputs in"):
        if staged is not None:
            interrupts.commit(staged)
    video_shape = [host.shape[i] for i in (0, 4, 1, 2, 3)] if on_device_frames else list(host.shape)
    return {
        **_summary(config, vae, z, kind, layout, video_shape, vae.planned(tuple(z.shape), kind=program)),
        **stages.run_fields(vae, load),
        **stages.compile_fields(compile_stage.seconds, cache_dir, cache_events.status),
        "decode_s": round(decode.seconds, 3),
        "write_s": round(write.seconds, 3),
        "frames_per_s": round(batch * frames_per_video / decode.seconds, 3),
        "streamed": False,
        "stream_why_not": why_not_streamed,
        # Written whole: the first frame reaches the host with the last.
        "first_frame_s": round(decode.seconds, 3),
        "end_to_end_s": round(time.perf_counter() - started, 3),
        "write_hidden": 0.0,
    }


def _summary(config: DecodeConfig, vae, z, kind: str, layout: str, video_shape: list[int], plan) -> dict[str, Any]:
    """What both ways of decoding one file say first: outputs, shapes, layout, the memory plan."""
    from cogvideox_torchax.io import outputs

    return {
        "outputs": [str(p) for p in outputs.output_paths(Path(config.output), z.shape[0])],
        "kind": kind,
        "latents_shape": list(z.shape),
        "layout": layout,
        "unscaled": bool(config.unscale),
        "video_shape": video_shape,
        "memory_plan": plan.as_dict(),
    }


def _stream_plan(config: DecodeConfig, vae, z, kind: str) -> tuple[Any, str | None]:
    """The streamed decode's plan (its two programs compiled, as the compile stage), or None and why not."""
    from cogvideox_torchax.cli import stream_choice

    why = stream_choice.why_not(config.stream, kind, vae, tuple(z.shape))
    if why is not None:
        return None, why
    plan, compiled, why = stream_choice.streamed_plan(
        vae, tuple(z.shape), lambda fn: stages.compile_stage(fn, z.shape, config.run)
    )
    return (None, why) if plan is None else ((plan, compiled), None)


def _decode_streamed(config: DecodeConfig, vae, z, kind: str, staged, streamed, *, layout, load, cache_dir):
    """Decodes batch by batch, each batch's frames written (on a thread) while the next decodes."""
    import numpy as np

    from cogvideox_torchax.cli import streamed_write
    from cogvideox_torchax.io import latents, outputs
    from cogvideox_torchax.memory import in_use

    plan, (compile_stage, cache_events) = streamed
    batch, frames_per_video = z.shape[0], _frame_count(z.shape[2])
    largest = float(np.abs(z).max())

    def check(chunk) -> None:
        if not chunk.finite.all():
            raise UsageError(out_of_memory.nonfinite_cause(vae, "decode", largest))

    open_writer = streamed_write.staged_writers(
        staged.temps, kind, fps=config.fps, crf=config.crf, encoder=config.encoder, preset=config.preset
    )
    total = batch * frames_per_video
    with Stage("decode", total, "frame", config.run.quiet) as decode, \
            Stage("write", total, "frame", config.run.quiet) as write:
        times = streamed_write.write_while_decoding(
            vae.decode_stream(z), open_writer, batch, check=check, on_decoded=decode.tick, on_written=write.tick,
            guard=lambda i, n: outputs.disk_full_named(staged.paths[i], n),
        )
    if config.run.memory_report:
        in_use.report("decode")
    interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
    interrupts.commit(staged)
    height, width = latents.frame_size(vae.config, z.shape)
    return {
        **_summary(config, vae, z, kind, layout, [batch, 3, frames_per_video, height, width], plan),
        **stages.run_fields(vae, load),
        **stages.compile_fields(compile_stage.seconds, cache_dir, cache_events.status),
        **times.as_dict(),
        "frames_per_s": round(total / times.decode_s, 3),
        "streamed": True,
        "stream_why_not": None,
    }


def _frame_count(latent_frames: int) -> int:
    # Upstream's decoder turns 1 latent frame into 1, each later pair into 8,
    # and a leading odd batch of 3 into 9: 1 -> 1, even T -> 4T, odd T -> 4T-3.
    if latent_frames == 1:
        return 1
    return 4 * latent_frames if latent_frames % 2 == 0 else 4 * latent_frames - 3


def _print_summary(s: dict[str, Any]) -> None:
    from cogvideox_torchax.io.paths import shown  # names that are not UTF-8 printed, not a failure

    if s.get("many"):
        from cogvideox_torchax.cli import decode_many

        decode_many.print_summary(s)
        return
    plan = s["memory_plan"]
    if s.get("dry_run"):
        print(
            f"plan for {s['latents_shape']} ({s['dtype']}, mesh {s['mesh']}): {plan['name']}, "
            f"{plan['bytes'] / 2**30:.2f} GiB per device of {plan['budget'] / 2**30:.2f} GiB usable; nothing run"
        )
        if not s["streamed"]:
            print(f"  not streamed: {s['stream_why_not']}")
        stages.print_target(s)
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
    if s.get("streamed"):
        print(f"  streamed: first frame after {s['first_frame_s']:.2f} s, done after {s['end_to_end_s']:.2f} s, "
              f"{100 * s['write_hidden']:.0f} % of the write hidden behind the decode")
    elif s.get("stream_why_not"):
        print(f"  not streamed ({s['stream_why_not']}): done after {s['end_to_end_s']:.2f} s")
    for path in s["outputs"]:
        print(f"  wrote {shown(path)}")


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0 ok, 1 error, 2 bad input, 3 out of memory, 130 interrupted)."""
    return command.command(_parser, argv, DecodeConfig.from_args, run, _print_summary)
