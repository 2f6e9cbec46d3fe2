"""The decode command's arguments as jobs, the model loaded for them: one input file one job, many files many.

A `Job` is what is written together: a file's videos (``-o``: moved in
together, or none) or one video of a many-latents run (each moved in as it
is done). `prepare` does it all, in order, process 0 reading and the others
sharing what it found: the inputs found (one file read before the model
loads, so that bad latents are refused first; many: found and the output
folder checked), one file's outputs staged (the writability probe), the
model loaded (`stages.load_together`), each input read into jobs (or failed
and named), and the jobs' batch shapes (equal shapes ``--batch-size``
videos at a time, padded to the mesh's ``dp``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cogvideox_torchax.cli import agreement, errors, interrupts, stages
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.io import family_latents, latents, outputs, video
from cogvideox_torchax.io.writer import VideoOptions, Writer
from cogvideox_torchax.parallel import distributed

if TYPE_CHECKING:
    from cogvideox_torchax.cli.decode_config import DecodeConfig

_GLOB_CHARS = set("*?[")
# NAME_MAX on Linux's file systems: a longer output name is refused before decoding, not when it is moved in.
_NAME_MAX = 255


class InputsError(ValueError):
    """Inputs or outputs of a many-latents run that cannot be used; nothing has been read or written."""


@dataclasses.dataclass(frozen=True)
class Job:
    """Videos written together: from video ``index`` of the latents in ``source``, one per output."""

    source: str
    index: int
    outputs: tuple[str, ...]
    shape: tuple[int, ...]  # the job's latents (videos, C, T, H, W), after layout and scaling

    def as_dict(self) -> dict:
        return {"source": self.source, "index": self.index, "outputs": list(self.outputs), "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> Job:
        return cls(d["source"], int(d["index"]), tuple(d["outputs"]), tuple(int(v) for v in d["shape"]))


@dataclasses.dataclass
class Work:
    """What a decode run works on, on every process (``found`` and ``writer``: process 0's)."""

    vae: Any
    load: Any  # the load stage (its seconds)
    cache_dir: Path | None
    jobs: list[Job]
    failed: list[dict[str, Any]]  # inputs that cannot be decoded, each named
    skipped: list[str]  # outputs there already (--skip-existing)
    shapes: dict[tuple[int, ...], tuple[int, ...]]  # each job shape's batch shape
    batches: list[list[Job]]  # jobs decoded together: one file's one; many: of one shape, --batch-size at a time
    inputs: int
    video: VideoOptions  # how videos are encoded: --fps (else the family's), --crf, the encoder
    layout: str | None = None  # one file's latents layout
    found: Found | None = None
    writer: Writer | None = None  # one file's outputs, staged before the model loads
    stage: Callable[[list, str], Writer] | None = None  # a Writer of outputs and their kind, as this run writes


def prepare(config: DecodeConfig, stack: contextlib.ExitStack) -> Work:
    """The run's jobs, the model loaded for them; one file's outputs staged (their writer entered on ``stack``).

    Raises:
        UsageError / ValueError: inputs, outputs or an output folder that cannot be used (exit 2), before the
            model loads wherever they can be.
    """
    many = config.output_dir is not None
    found = None
    with agreement.together("finding the inputs" if many else "reading the latents"):
        if agreement.is_primary():
            found = find(config)
    shared = distributed.share_json(None if found is None else
                                    {"inputs": len(found.sources), "videos": None if many else len(found.z)})
    names = [] if many or config.output is None else outputs.output_paths(Path(config.output), shared["videos"])
    # A Writer of outputs and their kind, its commit held whole against signals.
    stage = functools.partial(Writer, overwrite=config.overwrite, atomic=interrupts.deferred,
                              committed=interrupts.WRITTEN)
    writer = None
    with agreement.together("checking the outputs"):
        if agreement.is_primary() and config.run.dry_run:  # as the run would: refused now, nothing made
            outputs.check_outputs(names, overwrite=config.overwrite)
        elif agreement.is_primary() and not many:
            writer = stack.enter_context(stage(names, outputs.output_kind(config.output)))
    cache_dir, vae, load = stages.load_together(config.run)
    work: dict[str, Any] = {}
    with agreement.together("reading the inputs"):
        if agreement.is_primary():
            work = scan(config, vae, found)
    work = distributed.share_json(work)
    jobs = [Job.from_dict(d) for d in work["jobs"]]
    dp = vae.mesh.shape["dp"]
    size = config.batch_size or dp
    fps = config.fps if config.fps is not None else vae.family.fps
    return Work(vae, load, cache_dir, jobs, work["failed"], work["skipped"], batch_shapes(jobs, size, dp, many),
                batches(jobs, size) if many else [jobs], shared["inputs"],
                VideoOptions(fps, config.crf, config.encoder, config.preset), work.get("layout"), found, writer, stage)


@dataclasses.dataclass
class Found:
    """What `find` read before the model loads: the input paths; for one file its raw latents and metadata too."""

    sources: list[str]
    z: np.ndarray | None = None  # one file's latents: as read, then (`scan`) as the decode takes them
    metadata: dict[str, str] | None = None


def find(config: DecodeConfig) -> Found:
    """The inputs, on process 0 (the others get None: the command shares what it needs).

    Raises:
        UsageError / ValueError: inputs or an output folder that cannot be used (exit 2).
    """
    if config.output_dir is None:
        z = latents.read_latents(config.latents[0], config.key)
        latents.check_shape(z.shape)
        return Found([config.latents[0]], z, latents.read_metadata(config.latents[0]))
    out_dir = Path(config.output_dir)
    try:
        sources = expand_inputs(config.latents)
        check_names(sources, config.format)
    except InputsError as e:
        raise UsageError(str(e)) from e
    if any(len(os.fsencode(part)) > _NAME_MAX for part in out_dir.parts):
        raise UsageError(f"--output-dir {str(out_dir)!r}: a name in it is longer than the {_NAME_MAX} bytes "
                         "a folder takes")
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise UsageError(f"--output-dir {str(out_dir)!r} exists and is not a folder")
    if not out_dir.exists() and not out_dir.parent.is_dir():
        raise UsageError(f"--output-dir {str(out_dir)!r}: its parent folder does not exist")
    folder = out_dir if out_dir.exists() else out_dir.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--output-dir {str(out_dir)!r}: {str(folder)!r} is not writable")
    return Found([str(p) for p in sources])


def expand_inputs(specs: Iterable[str]) -> list[Path]:
    """Files named, ``*.safetensors`` entries of folders named, and glob matches, in order, each once.

    Every entry a folder holds under a latents name, and every match of a
    pattern, is an input, whatever it turns out to be: one that cannot be
    read as latents (a folder, a link that leads nowhere, a FIFO, a file
    without read permission) is named and failed by the reader, never
    passed over here.

    Raises:
        InputsError: a name that is neither an entry nor a pattern matching one; a folder that cannot be
            listed; a folder or pattern with no latents.
    """
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if os.path.isdir(spec):
            try:
                with os.scandir(spec) as entries:
                    names = sorted(e.name for e in entries if e.name.endswith(".safetensors"))
            except OSError as e:
                raise InputsError(f"folder {spec!r} cannot be listed: {e.strerror}") from None
            if not names:
                raise InputsError(f"folder {spec!r} holds no .safetensors files")
            matches = [path / name for name in names]
        elif os.path.lexists(spec):  # a file, or what the reader will name (a FIFO, a link that leads nowhere)
            matches = [path]
        elif _GLOB_CHARS & set(spec):
            matches = sorted(Path(p) for p in glob.glob(spec))
            if not matches:
                raise InputsError(f"pattern {spec!r} matches no file or folder")
        else:
            raise InputsError(f"latents file {spec!r} does not exist")
        found.extend(matches)
    unique: dict[str, Path] = {}
    for path in found:
        # The same file named twice is one input; two links that lead nowhere are two.
        unique.setdefault(os.path.realpath(path) if os.path.exists(path) else os.path.abspath(path), path)
    return list(unique.values())


def output_name(source: Path, index: int, count: int, kind: str) -> str:
    """``clip.mp4`` for a file of one video, ``clip_0.mp4``, ``clip_1.mp4``, ... for more; a folder for PNG."""
    if kind not in outputs.KINDS:
        raise ValueError(f"unknown output format {kind!r}; use one of {', '.join(outputs.KINDS)}")
    stem = source.stem if count == 1 else f"{source.stem}_{index}"
    return stem if kind == "png" else f"{stem}.{kind}"


def check_names(sources: Sequence[Path], kind: str) -> None:
    """Refuses inputs whose outputs would share a name (the same file name in two folders).

    Raises:
        InputsError: naming the two inputs.
    """
    seen: dict[str, Path] = {}
    for source in sources:
        name = output_name(source, 0, 1, kind)
        if name in seen:
            raise InputsError(f"{str(seen[name])!r} and {str(source)!r} would both write {name!r}; "
                              "decode them in separate runs or rename one")
        seen[name] = source


def prepared(config: DecodeConfig, vae, source: str, found: Found | None = None) -> tuple[np.ndarray, str]:
    """The latents of ``source`` (read unless ``found`` has them) as the VAE's decode takes them, and their layout.

    A file another family's pipelines wrote is refused; an mp4 output checked for its frame size.
    """
    read = (found.z, found.metadata) if found is not None else None
    z, layout, warnings = family_latents.read_for(vae, source, config.key, layout=config.layout,
                                                  unscale=config.unscale, read=read)
    for warning in warnings:
        errors.warn_once(warning, config.run.quiet)
    if (config.format or (config.output and outputs.output_kind(config.output))) == "mp4":
        video.check_mp4_size(*family_latents.frame_size(vae, z.shape))
    return z, layout


def scan(config: DecodeConfig, vae, found: Found) -> dict[str, Any]:
    """Each input read once and prepared: its jobs, or why it fails or is skipped. Process 0 only.

    One file is one job of all its videos (a failure is the run's); with
    ``--output-dir`` each video is a job and a file that cannot be decoded
    is failed and named.

    Raises:
        UsageError: two videos would write one output, an output would replace an input, or outputs exist
            (without ``--skip-existing`` or ``--overwrite``).
    """
    if config.output_dir is None:  # a failure is the run's
        found.z, layout = prepared(config, vae, found.sources[0], found)
        names = [] if config.output is None else outputs.output_paths(Path(config.output), found.z.shape[0])
        job = Job(found.sources[0], 0, tuple(map(str, names)), tuple(found.z.shape))
        return {"jobs": [job.as_dict()], "failed": [], "skipped": [], "layout": layout}
    with stages.Stage("read", len(found.sources), "file", config.run.quiet) as bar:
        return _scan_many(config, vae, found, bar)


def _scan_many(config: DecodeConfig, vae, found: Found, bar: stages.Stage) -> dict[str, Any]:
    out_dir = Path(config.output_dir)
    jobs, failed, skipped, existing = [], [], [], []
    inputs = {os.path.realpath(source) for source in found.sources}
    writers: dict[str, str] = {}
    for source in found.sources:
        try:
            z, _ = prepared(config, vae, source)
            names = [output_name(Path(source), i, z.shape[0], config.format) for i in range(z.shape[0])]
            for name in names:
                if len(os.fsencode(name)) > _NAME_MAX:
                    raise ValueError(f"its output name {name!r} would be {len(os.fsencode(name))} bytes, longer "
                                     f"than the {_NAME_MAX} a folder takes; rename the input")
        except (ValueError, OSError) as e:
            failed.append({"input": source, "error": errors.one_line(e)})
            bar.write(f"failed: {source!r}: {errors.one_line(e)}")
            bar.tick()
            continue
        for i, name in enumerate(names):
            output = out_dir / name
            who = f"{source} (video {i})" if z.shape[0] > 1 else source
            if os.path.realpath(output) in inputs:
                raise UsageError(f"the output of {who!r} would be {str(output)!r}, one of the inputs; "
                                 "pick another --output-dir or --format")
            if str(output) in writers:
                raise UsageError(f"{writers[str(output)]!r} and {who!r} would both write {str(output)!r}; "
                                 "decode them in separate runs or rename one")
            writers[str(output)] = who
            if os.path.lexists(output):
                if config.skip_existing and _is_finished_output(output, config.format):
                    skipped.append(str(output))
                    continue
                if config.skip_existing:  # a folder where a file goes, a link, a FIFO: not a finished output
                    raise UsageError(f"{str(output)!r} is in the place of an output but is not one "
                                     f"({'a folder of frames' if config.format == 'png' else 'a file'}); "
                                     "move it away, or pass --overwrite where it may be replaced")
                if not config.overwrite:
                    existing.append(str(output))
            jobs.append(Job(source, i, (str(output),), (1, *z.shape[1:])).as_dict())
        bar.tick()
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UsageError(
            f"output {existing[0]!r}{more} exists; pass --skip-existing to keep and skip, or --overwrite to replace"
        )
    return {"jobs": jobs, "failed": failed, "skipped": skipped}


def _is_finished_output(output: Path, kind: str) -> bool:
    # What --skip-existing keeps: the kind the run would have written, not a link to one.
    if output.is_symlink():
        return False
    return output.is_dir() if kind == "png" else output.is_file()


def padded_size(count: int, batch_size: int, dp: int) -> int:
    """The batch a shape with ``count`` videos runs at: ``batch_size``, or fewer when the shape has fewer videos.

    Always a multiple of ``dp`` (each ``dp`` slice of the mesh takes whole
    videos), so a short last run is padded with zeros, never a new program.
    """
    if min(count, batch_size, dp) < 1:
        raise ValueError(f"count, batch size and dp must be at least 1, got {count}, {batch_size}, {dp}")
    return min(-(-batch_size // dp) * dp, -(-count // dp) * dp)


def batches(jobs: Sequence[Job], batch_size: int) -> list[list[Job]]:
    """Jobs grouped by shape (in order of first appearance), cut into runs of at most ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    groups: dict[tuple[int, ...], list[Job]] = {}
    for job in jobs:
        groups.setdefault(job.shape, []).append(job)
    return [group[i : i + batch_size] for group in groups.values() for i in range(0, len(group), batch_size)]


def batch_shapes(jobs: Sequence[Job], size: int, dp: int, padded: bool) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Each job shape's batch shape: one program per latent shape, at the batch its runs share."""
    counts: dict[tuple[int, ...], int] = {}
    for job in jobs:
        counts[job.shape] = counts.get(job.shape, 0) + 1
    if not padded:  # one file: its own batch
        return {s: s for s in counts}
    return {s: (padded_size(n, size, dp), *s[1:]) for s, n in counts.items()}
