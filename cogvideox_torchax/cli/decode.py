"""``python -m cogvideox_torchax.decode LATENTS``: decode latents to a video.

A thin command line over the library. Latents come from a safetensors file,
as the model family's pipelines return them (``output_type="latent"``:
CogVideoX ``(B, T, C, H, W)`` times the scaling factor, Wan ``(B, C, T, H, W)``
normalised per channel; LTX-2 and LTX-Video ``(B, C, T, H, W)`` normalised per
channel as their pipelines hold them before decoding, where their ``output_type="latent"``
returns them denormalised: ``--no-unscale``), and are brought to what
``vae.decode`` takes unless ``--no-unscale``; latents a file's metadata says are another
family's are refused. The video is
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
import dataclasses
import time
from pathlib import Path
from typing import Any

from cogvideox_torchax.cli import agreement, command, decode_report, errors, interrupts, options, out_of_memory, stages
from cogvideox_torchax.cli.decode_config import DecodeConfig
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.cli.options import add_model_arguments
from cogvideox_torchax.cli.stages import Stage


def _family_fps() -> str:
    from cogvideox_torchax import families

    return ", ".join(f"{family.title} {family.fps:g}" for family in families.FAMILIES.values())


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
        help="latent layout; auto detects it from the model's latent channel count (each family as its pipelines "
        f"hold latents: {options.by_family(lambda f: f.pipeline_layout)})",
    )
    p.add_argument(
        "--no-unscale",
        dest="unscale",
        action="store_false",
        help="latents are already as vae.decode takes them (default: undo the scaling of the model's pipelines, as "
        f"each family's hold latents: {options.by_family(lambda f: f.normalization, '; ')})",
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
    p.add_argument("--fps", type=float, default=None,
                   help=f"mp4 frame rate, 0.01 to 1000 (default the model's: {_family_fps()})")
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
    """Decodes as the configuration says and returns the summary.

    A decoder that draws noise (LTX-Video 0.9.1's) draws it from a generator
    seeded 0 for each decode: the same latents, the same video.
    """
    from cogvideox_torchax.vae import drawn_noise

    with drawn_noise.seeded_calls(0):
        if config.output_dir is not None:
            from cogvideox_torchax.cli import decode_many

            return decode_many.run(config)
        return _run_one(config)


def _run_one(config: DecodeConfig) -> dict[str, Any]:
    from cogvideox_torchax.io import latents, outputs
    from cogvideox_torchax.parallel import distributed

    kind = outputs.output_kind(config.output) if config.output is not None else None
    z, metadata = None, None
    with agreement.together("reading the latents"):
        if agreement.is_primary():
            z = latents.read_latents(config.latents[0], config.key)
            latents.check_shape(z.shape)
            metadata = latents.read_metadata(config.latents[0])
    z, metadata = distributed.share_array(z), distributed.share_json(metadata)
    config = dataclasses.replace(config, metadata=metadata)
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

    _, vae, load = stages.load_together(config.run)
    z, layout = _prepared(config, vae, z)
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
    from cogvideox_torchax.io import family_latents, outputs, video
    from cogvideox_torchax.memory import in_use
    from cogvideox_torchax.parallel import distributed

    cache_dir, vae, load = stages.load_together(config.run)
    z, layout = _prepared(config, vae, z)
    if kind == "mp4":
        video.check_mp4_size(*family_latents.frame_size(vae, z.shape))
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
    batch, frames_per_video = z.shape[0], family_latents.frames_of(vae, z.shape[2])

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
                        video.write_video_to(tmp, kind, one, fps=config.fps_for(vae), crf=config.crf, tick=write.tick,
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
        **decode_report.summary(config, vae, z, kind, layout, video_shape, vae.planned(tuple(z.shape), kind=program)),
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
    from cogvideox_torchax.io import family_latents, outputs
    from cogvideox_torchax.memory import in_use

    plan, (compile_stage, cache_events) = streamed
    batch, frames_per_video = z.shape[0], family_latents.frames_of(vae, z.shape[2])
    largest = float(np.abs(z).max())

    def check(chunk) -> None:
        if not chunk.finite.all():
            raise UsageError(out_of_memory.nonfinite_cause(vae, "decode", largest))

    open_writer = streamed_write.staged_writers(
        staged.temps, kind, fps=config.fps_for(vae), crf=config.crf, encoder=config.encoder, preset=config.preset
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
    height, width = family_latents.frame_size(vae, z.shape)
    return {
        **decode_report.summary(config, vae, z, kind, layout, [batch, 3, frames_per_video, height, width], plan),
        **stages.run_fields(vae, load),
        **stages.compile_fields(compile_stage.seconds, cache_dir, cache_events.status),
        **times.as_dict(),
        "frames_per_s": round(total / times.decode_s, 3),
        "streamed": True,
        "stream_why_not": None,
    }


def _prepared(config: DecodeConfig, vae, z):
    """The latents as the VAE's decode takes them, and their layout; a file of another family's refused."""
    from cogvideox_torchax.io import family_latents

    for warning in family_latents.check_origin(vae, config.metadata or {}, repr(config.latents[0])):
        errors.warn_once(warning, config.run.quiet)
    return family_latents.prepare_for(vae, z, layout=config.layout, unscale=config.unscale)


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0 ok, 1 error, 2 bad input, 3 out of memory, 130 interrupted)."""
    return command.command(_parser, argv, DecodeConfig.from_args, run, decode_report.print_summary)
