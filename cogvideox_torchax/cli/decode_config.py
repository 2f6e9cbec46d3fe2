"""The decode command's options, checked before anything is read: `DecodeConfig`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from cogvideox_torchax.cli import options
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.io import video

# mp4 stores the frame rate as a fraction of denominator <= 1001 (`video.encode_mp4`): these all are.
FPS_RANGE = (0.01, 1000.0)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The decode command's options, checked: what to read, what to write, and the shared `options.RunOptions`."""

    run: options.RunOptions
    latents: tuple[str, ...]
    key: str | None = None
    layout: str = "auto"
    unscale: bool = True
    output: str | None = None
    output_dir: str | None = None
    format: str | None = None  # --output-dir's kind of output (mp4 unless given)
    batch_size: int | None = None
    skip_existing: bool = False
    fps: float | None = None  # None: the model family's own (`families.Family.fps`)
    crf: int = 18
    overwrite: bool = False
    encoder: str = "libx264"
    preset: str | None = None
    stream: bool = True
    metadata: dict[str, str] | None = None  # the latents file's, once read (process 0's, shared)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DecodeConfig:
        """Checks what needs no reading.

        Raises:
            UsageError: options that cannot go together or values out of range (exit 2).
        """
        options.check_shared_cheaply(args)  # what needs no framework first: refused in milliseconds
        if args.fps is not None:
            options.check_range("--fps", args.fps, *FPS_RANGE)
        options.check_range("--crf", args.crf, 0, 51)
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
            if args.batch_size is not None:
                options.check_range("--batch-size", args.batch_size, 1)
            if args.skip_existing and args.overwrite:
                raise UsageError("--skip-existing and --overwrite contradict each other; pick one")
        if args.output is not None:
            is_dir = not Path(args.output.rstrip("/")).suffix  # no suffix: a folder of PNG frames
            options.check_output_path("--output", args.output, args.latents, is_dir)
        _check_encoder(args)
        run = options.RunOptions.from_args(args)  # imports JAX: after every check that needs no framework
        return cls(
            run, tuple(args.latents), args.key, args.layout, args.unscale, args.output, args.output_dir,
            (args.format or "mp4") if args.output_dir is not None else None, args.batch_size, args.skip_existing,
            args.fps, args.crf, args.overwrite, args.encoder, args.preset, args.stream,
        )

    def with_run(self, run: options.RunOptions) -> DecodeConfig:
        return dataclasses.replace(self, run=run)


# NVENC's presets (p1 fastest ... p7 best); libx264's are `io.video.X264_PRESETS`.
_NVENC_PRESETS = tuple(f"p{i}" for i in range(1, 8))


def _check_encoder(args: argparse.Namespace) -> None:
    """``--encoder`` and ``--preset``: known names, for an mp4 output, and an encoder that starts here."""
    if args.encoder == "libx264" and args.preset is None:
        return
    writes_mp4 = (args.output is not None and Path(args.output).suffix.lower() == ".mp4") or (
        args.output_dir is not None and (args.format or "mp4") == "mp4"
    )
    if not writes_mp4:
        raise UsageError("--encoder and --preset go with an mp4 output")
    if args.encoder not in video.ENCODERS:
        raise UsageError(f"--encoder must be one of {', '.join(video.ENCODERS)}, got {args.encoder!r}")
    presets = video.X264_PRESETS if args.encoder == "libx264" else _NVENC_PRESETS
    if args.preset is not None and args.preset not in presets:
        raise UsageError(f"--preset for {args.encoder} must be one of {', '.join(presets)}, got {args.preset!r}")
    if args.encoder != "libx264" and not args.dry_run:
        try:
            video.check_encoder(args.encoder)
        except ValueError as e:
            raise UsageError(str(e)) from None
