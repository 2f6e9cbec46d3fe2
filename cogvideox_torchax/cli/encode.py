"""``python -m cogvideox_torchax.encode VIDEO -o latents.safetensors``: encode a video to latents.

A thin command line over the library, the counterpart of
``python -m cogvideox_torchax.decode``. The video is an mp4 (or .mov, .mkv,
.webm) or a folder of image frames; it is centre-cropped to a height and
width divisible by the model's spatial factor (or scaled and cropped to
--size), and its frames are cut to the largest count that decodes back to
the same length (or --frames): CogVideoX 8k+1, Wan 4k+1, LTX-2 and LTX-Video 8k+1 (see
`cogvideox_torchax.io.frames`). The latents are written as the model's
pipelines hold them (CogVideoX ``(1, T, C, H, W)`` times the scaling factor,
Wan, LTX-2 and LTX-Video ``(1, C, T, H, W)`` normalised per channel), under the key ``latents``,
the model and scaling in the file's metadata, so the decode command reads
them back with no flags. Bad input is one line on stderr, exit code 2, and no
output file; the exit codes are listed in ``--help``. Under jax.distributed
(``--coordinator``/``--distributed``) every process runs the same command;
process 0 reads the video and writes the latents.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from cogvideox_torchax.cli import agreement, command, errors, interrupts, options, out_of_memory, plans, stages
from cogvideox_torchax.cli import summary as report
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.cli.options import add_model_arguments
from cogvideox_torchax.cli.stages import Stage
from cogvideox_torchax.io import family_latents, frames, outputs
from cogvideox_torchax.io.writer import Writer
from cogvideox_torchax.memory import in_use
from cogvideox_torchax.parallel import distributed


def _parser() -> argparse.ArgumentParser:
    p = options.Parser.for_command("encode", __doc__)
    p.add_argument("video", help="video file (.mp4, .mov, .mkv, .webm) or a folder of frames (.png, .jpg, ...)")
    p.add_argument(
        "--output", "-o",
        help="latents file to write (.safetensors; key 'latents', as the model's pipelines hold them); "
        "not with --dry-run",
    )
    p.add_argument(
        "--size",
        default=None,
        metavar="HxW",
    )
    p.help_when_shown("size", lambda: (
        "scale to cover and centre-crop to this height x width, each a positive multiple of the model's spatial "
        f"factor ({options.by_family(options.spatial_factors)}) (default: centre-crop to the multiples below the "
        "video's size)"))
    p.add_argument(
        "--frames",
        type=int,
        default=None,
    )
    p.help_when_shown("frames", lambda: (
        "encode the first N frames, at least 1, a count the model's encode reads (default: the largest count "
        f"available that decodes back to itself: {options.by_family(_frame_rules)})"))
    p.add_argument(
        "--sample",
        action="store_true",
        help="draw the latents from the posterior (as the image-to-video pipeline does) instead of its mode",
    )
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the torch generator for --sample, 0 to 2^64-1")
    add_model_arguments(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file (never a folder)")
    return options.with_shared_arguments(p)


def _frame_rules(family) -> str:
    # The counts that round-trip, by each published config of the family (its presets other than test ones).
    return "/".join(sorted({family.frame_rule(c) for name, c in family.presets.items() if "tiny" not in name}))


@dataclasses.dataclass(frozen=True)
class EncodeConfig:
    """The encode command's options, checked: what to read and fit, what to write, the shared `options.RunOptions`."""

    run: options.RunOptions
    video: str
    output: str | None = None
    size: tuple[int, int] | None = None  # --size as (height, width)
    frames: int | None = None
    sample: bool = False
    sample_seed: int = 0
    overwrite: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EncodeConfig:
        """Checks what needs no reading.

        Raises:
            UsageError: values out of range or a missing output (exit 2).
        """
        options.check_shared_cheaply(args)  # what needs no framework first: refused in milliseconds
        if args.output is None and not args.dry_run:
            raise UsageError("--output/-o is needed (only --dry-run goes without)")
        if args.output is not None and Path(args.output).suffix.lower() != ".safetensors":
            raise UsageError(f"output must be a .safetensors file, got {args.output!r}")
        if args.frames is not None:
            options.check_range("--frames", args.frames, 1)
        options.check_range("--sample-seed", args.sample_seed, *options.SEED_RANGE)
        if args.output is not None:
            options.check_output_path("--output", args.output, [args.video], is_dir=False)
        try:
            size = None if args.size is None else frames.parse_size(args.size)
        except frames.FramesError as e:
            raise UsageError(f"--size: {e}") from e
        run = options.RunOptions.from_args(args)
        return cls(run, args.video, args.output, size, args.frames, args.sample, args.sample_seed, args.overwrite)

    def with_run(self, run: options.RunOptions) -> EncodeConfig:
        return dataclasses.replace(self, run=run)


def run(config: EncodeConfig) -> dict[str, Any]:
    """Encodes as the configuration says and returns the summary."""
    if config.run.dry_run:
        # As the run would: an output it would refuse is refused now (exit 2), nothing made.
        paths = [] if config.output is None else [Path(config.output)]
        with agreement.together("checking the output"):
            if agreement.is_primary():
                outputs.check_outputs(paths, overwrite=config.overwrite)
        return {**_dry_run(config), "output": config.output}
    # The output path is checked, and its temporary file made (the
    # writability probe), before anything expensive; on process 0 only.
    writer = None
    with agreement.together("checking the output"):
        if agreement.is_primary():
            writer = Writer([Path(config.output)], "latents", overwrite=config.overwrite, atomic=interrupts.deferred,
                            committed=interrupts.WRITTEN)
    with writer if writer is not None else contextlib.nullcontext():
        return _encode(config, writer)


def _read(config: EncodeConfig, quiet: bool):
    """The video's frames ``(F, H, W, 3)`` (None but on process 0), its ``(frames, height, width)`` and fps.

    Read before the model loads: a video that cannot be read is refused first.
    """
    raw, info = None, None
    with agreement.together("reading the video"), Stage("read", 1, "video", quiet) as read:
        if agreement.is_primary():
            raw, fps = frames.read_frames(config.video)
            info = {"input_shape": [int(v) for v in raw.shape[:3]], "fps": fps}
        read.tick()
    return raw, distributed.share_json(info), read


def _fit(config: EncodeConfig, vae, raw):
    """The video fitted to what ``vae``'s family round-trips, ``(1, 3, F, H, W)`` in [-1, 1], on every process."""
    family, model = vae.family, vae.config
    geometry = {"spatial": family.spatial_scale(model), "frame_step": family.frame_step(model)}
    if config.frames is not None and family.frames_read(model, config.frames) != config.frames:
        read = family.frames_read(model, config.frames)
        raise UsageError(
            f"--frames {config.frames}: {family.title}'s encode reads the first frame, then "
            f"{geometry['frame_step']} at a time, so only {read} of them; ask for {read} or "
            f"{read + geometry['frame_step']} ({family.frame_rule(model)} frames decode back to as many)"
        )
    x = None
    with agreement.together("fitting the video"):
        if agreement.is_primary():
            _check_host_memory(raw.shape, config, geometry)
            x = frames.to_video_tensor(frames.fit(raw, size=config.size, num_frames=config.frames, **geometry))
    return distributed.share_array(x)


def _check_host_memory(shape: tuple[int, ...], config: EncodeConfig, geometry: dict[str, int]) -> None:
    """Refuses (exit 3) fitting a video the host has no memory for, before trying."""
    from cogvideox_torchax.memory import budget  # imports JAX: not before the options are checked

    need = frames.fit_bytes(shape, size=config.size, num_frames=config.frames, **geometry)
    have = budget.host_available()
    if need > have:
        size = f"{config.size[0]}x{config.size[1]}" if config.size else f"{shape[1]}x{shape[2]}"
        raise errors.OutOfMemory(
            f"fitting the video to {size} needs {budget.human(need)} of host memory, "
            f"{budget.human(have)} available; pick a smaller --size or fewer --frames"
        )


def _dry_run(config: EncodeConfig) -> dict[str, Any]:
    """Reads the video, loads the model and plans the encode's memory (compiling, not running); writes nothing."""
    raw, _, _ = _read(config, quiet=True)
    _, vae, load = stages.load_together(config.run)
    x = _fit(config, vae, raw)
    vae.check_video(x.shape)
    plan, _, stage = plans.plan_stage(vae, x.shape, "encode", config.run)
    out = {"dry_run": True, **report.run_fields(vae, load), "memory_plan": plan.as_dict(),
           "plan_s": round(stage.seconds, 3), "video_shape": list(x.shape)}
    if config.run.model.target is not None:
        with out_of_memory.out_of_memory_as_exit_3("compiling the encode of", x.shape):
            out.update(plans.target_report(vae, tuple(x.shape), "encode", config.run.model.target, plan))
    return out


def _encode(config: EncodeConfig, writer: Writer | None) -> dict[str, Any]:
    raw, info, read = _read(config, config.run.quiet)

    import jax  # about 1 s: after the video is read, so that one that cannot be is refused first
    import torch  # as JAX

    cache_dir, vae, load = stages.load_together(config.run)
    x = _fit(config, vae, raw)
    del raw
    vae.check_video(x.shape)

    num_frames = x.shape[2]

    def encode_all():
        with Stage("encode", num_frames, "frame", config.run.quiet) as encode:
            # One compiled program encodes the whole video; the bar completes
            # when it returns.
            moments = jax.block_until_ready(vae.encode_jax(x))
            encode.tick(num_frames)
        return encode, moments

    # Compiled, then run, each agreed by every process (the run retried once on a smaller plan).
    with agreement.together("compiling the encode"), \
            out_of_memory.out_of_memory_as_exit_3("compiling the encode of", x.shape, vae, "encode"), \
            plans.compiling(config.run) as compiled:
        vae.compile_encode(x.shape)
    with agreement.together("encoding"), out_of_memory.agreed_retry(vae, "encoding video of", quiet=config.run.quiet), \
            out_of_memory.out_of_memory_as_exit_3("encoding video of", x.shape, vae, "encode"):
        encode, moments = encode_all()
    # Every process takes part in gathering the moments (outside `together`:
    # a collective); only process 0 writes.
    posterior = vae.latent_dist(moments)
    del moments
    if config.sample:
        z = posterior.sample(generator=torch.Generator().manual_seed(config.sample_seed))
    else:
        z = posterior.mode()
    if config.run.memory_report:
        in_use.report("encode")

    out, layout = family_latents.to_pipeline(vae, z.float().numpy())
    out_of_memory.check_finite(out, vae, "encode", float(np.abs(x).max()))
    metadata = {
        **family_latents.metadata_for(vae, layout),
        "scaled": "true",
        "posterior": "sample" if config.sample else "mode",
        "frames": str(num_frames),
        "height": str(x.shape[3]),
        "width": str(x.shape[4]),
    }
    with agreement.together("writing the output"):
        with Stage("write", 1, "file", config.run.quiet) as write:
            if writer is not None:
                writer.write(0, out, metadata=metadata)
            write.tick()
        if config.run.memory_report:
            in_use.report("write")
        interrupts.check_interrupted()  # a Ctrl-C swallowed on the way: nothing is moved in
    # Moved in only once every process has come through the step.
    with agreement.together("moving the output in"):
        if writer is not None:
            writer.commit()

    return {
        "input": str(config.video),
        "input_shape": info["input_shape"],
        "fps": info["fps"],
        "video_shape": list(x.shape),
        "output": str(config.output),
        "latents_shape": list(out.shape),
        "layout": layout,
        "normalization": vae.family.normalization,
        **({"scaling_factor": float(vae.config.scaling_factor)} if "scaling_factor" in metadata else {}),
        "posterior": metadata["posterior"],
        **report.run_fields(vae, load),
        "memory_plan": vae.planned(tuple(x.shape), kind="encode").as_dict(),
        "read_s": round(read.seconds, 3),
        **report.compile_fields(compiled.seconds, cache_dir, compiled.cache),
        "encode_s": round(encode.seconds, 3),
        "write_s": round(write.seconds, 3),
        "frames_per_s": round(num_frames / encode.seconds, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0 ok, 1 error, 2 bad input, 3 out of memory, 130 interrupted)."""
    return command.command(_parser, argv, EncodeConfig.from_args, run, report.print_encode)
