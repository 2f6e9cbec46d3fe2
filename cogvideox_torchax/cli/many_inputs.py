"""The inputs of a decode ``--output-dir`` run: found, read once into work items, read again batch by batch.

Process 0 expands the arguments into input files (`batch.expand_inputs`),
checks the output folder, and reads each input once (`scan`): its videos
become work items with their outputs, or the input is failed and named.
Outputs that clash, would replace an input, or exist (without
``--skip-existing`` or ``--overwrite``) are refused here, before anything
is decoded. `read_run` reads one batch's latents again when it decodes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cogvideox_torchax.cli import agreement, batch, errors
from cogvideox_torchax.cli.errors import UsageError
from cogvideox_torchax.cli.stages import Stage

if TYPE_CHECKING:
    from cogvideox_torchax.cli.decode_config import DecodeConfig

# NAME_MAX on Linux's file systems: a longer output name is refused before decoding, not when it is moved in.
_NAME_MAX = 255


def find_inputs(config: DecodeConfig, out_dir: Path) -> list[Path]:
    """The input files, checked for clashing output names; the output folder, checked (not made)."""
    try:
        sources = batch.expand_inputs(config.latents)
        batch.check_names(sources, config.format)
    except batch.InputsError as e:
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
    return sources


def prepared(config: DecodeConfig, vae, source: str) -> np.ndarray:
    from cogvideox_torchax.io import family_latents, latents, video

    z = latents.read_latents(source, config.key)
    latents.check_shape(z.shape)
    for warning in family_latents.check_origin(vae, latents.read_metadata(source), repr(source)):
        errors.warn_once(warning, config.run.quiet)
    z, _ = family_latents.prepare_for(vae, z, layout=config.layout, unscale=config.unscale)
    if config.format == "mp4":
        video.check_mp4_size(*family_latents.frame_size(vae, z.shape))
    return z


def scan(config: DecodeConfig, vae, sources: list[str], out_dir: Path) -> dict[str, Any]:
    """Reads each input once: its videos as work items, or why it is skipped. Process 0 only.

    Raises:
        UsageError: two videos would write one output (``clip_1`` of a file
            of several videos and a file ``clip_1``), an output would
            replace an input, or outputs exist (without ``--skip-existing``
            or ``--overwrite``).
    """
    items, failed, skipped, existing = [], [], [], []
    inputs = {os.path.realpath(source) for source in sources}
    writers: dict[str, str] = {}
    with Stage("read", len(sources), "file", config.run.quiet) as bar:
        for source in sources:
            try:
                z = prepared(config, vae, source)
                names = [batch.output_name(Path(source), i, z.shape[0], config.format) for i in range(z.shape[0])]
                _check_name_lengths(names)
            except (ValueError, OSError) as e:
                failed += failures([source], errors.one_line(e), bar)
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
                items.append(batch.Item(source, i, str(output), (1, *z.shape[1:])).as_dict())
            bar.tick()
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UsageError(
            f"output {existing[0]!r}{more} exists; pass --skip-existing to keep and skip, or --overwrite to replace"
        )
    return {"items": items, "failed": failed, "skipped": skipped}


def _check_name_lengths(names: list[str]) -> None:
    for name in names:
        if len(os.fsencode(name)) > _NAME_MAX:
            raise ValueError(f"its output name {name!r} would be {len(os.fsencode(name))} bytes, longer than "
                             f"the {_NAME_MAX} a folder takes; rename the input")


def _is_finished_output(output: Path, kind: str) -> bool:
    # What --skip-existing keeps: the kind the run would have written, not a link to one.
    if output.is_symlink():
        return False
    return output.is_dir() if kind == "png" else output.is_file()


def read_run(config: DecodeConfig, vae, items: list[batch.Item], shape: tuple[int, ...]):
    """The latents of one batch, zero-padded to ``shape``, and the sources that could not be read again."""
    z = np.zeros(shape, np.float32)
    unread: dict[str, str] = {}
    cache: dict[str, np.ndarray] = {}
    for i, item in enumerate(items):
        try:
            if item.source not in cache:
                cache = {item.source: prepared(config, vae, item.source)}  # files of several videos: read once
            one = cache[item.source][item.index : item.index + 1]
            if one.shape != item.shape:
                raise ValueError(f"{item.source!r} changed while this command ran (now {one.shape})")
            z[i] = one[0]
        except (ValueError, OSError) as e:
            unread[item.source] = errors.one_line(e)
    return z, unread


def failures(items: list, error: str, bar: Stage) -> list[dict[str, Any]]:
    """Reports each failed input (a path, or an `Item`: a video of a file) on stderr (process 0); returns them."""
    out = []
    for item in items:
        if isinstance(item, str):
            entry: dict[str, Any] = {"input": item, "error": error}
            name = repr(item)
        else:
            entry = {"input": item.source, "video": item.index, "output": item.output, "error": error}
            name = f"{item.source!r} -> {item.output!r}"
        if agreement.is_primary():
            bar.write(f"failed: {name}: {error}")
        out.append(entry)
    return out
