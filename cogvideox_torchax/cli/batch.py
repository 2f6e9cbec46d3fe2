"""Decoding many latents in one run: which files, which outputs, which batches.

The decode command's ``--output-dir`` mode: the inputs (files, folders of
``*.safetensors``, glob patterns) become one work item per video, named
after its file; items whose latents have the same shape are decoded
together, ``batch_size`` at a time, so one program is compiled per shape.
Nothing here touches JAX or reads a latent; the command does (on process 0
under jax.distributed) and shares the plan.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cogvideox_torchax.io.outputs import KINDS

_GLOB_CHARS = set("*?[")


class InputsError(ValueError):
    """Inputs or outputs of a many-latents run that cannot be used; nothing has been read or written."""


def expand_inputs(specs: Iterable[str]) -> list[Path]:
    """Files named, ``*.safetensors`` entries of folders named, and glob matches, in order, each once.

    Every entry a folder holds under a latents name, and every match of a
    pattern, is an input, whatever it turns out to be: one that cannot be
    read as latents (a folder, a link that leads nowhere, a FIFO, a file
    without read permission) is named and failed by the reader, never
    passed over here.

    Raises:
        InputsError: a name that is neither an entry nor a pattern matching
            one; a folder that cannot be listed; a folder or pattern with no
            latents.
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
    if kind not in KINDS:
        raise ValueError(f"unknown output format {kind!r}; use one of {', '.join(KINDS)}")
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
            raise InputsError(
                f"{str(seen[name])!r} and {str(source)!r} would both write {name!r}; "
                "decode them in separate runs or rename one"
            )
        seen[name] = source


@dataclass(frozen=True)
class Item:
    """One video to decode: video ``index`` of the latents in ``source``, written to ``output``."""

    source: str
    index: int
    output: str
    shape: tuple[int, ...]  # its latents (1, C, T, H, W), after layout and scaling

    def as_dict(self) -> dict:
        return {"source": self.source, "index": self.index, "output": self.output, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> Item:
        return cls(d["source"], int(d["index"]), d["output"], tuple(int(v) for v in d["shape"]))


def padded_size(count: int, batch_size: int, dp: int) -> int:
    """The batch a shape with ``count`` videos runs at: ``batch_size``, or fewer when the shape has fewer videos.

    Always a multiple of ``dp`` (each ``dp`` slice of the mesh takes whole
    videos), so a short last run is padded with zeros, never a new program.
    """
    if min(count, batch_size, dp) < 1:
        raise ValueError(f"count, batch size and dp must be at least 1, got {count}, {batch_size}, {dp}")
    return min(-(-batch_size // dp) * dp, -(-count // dp) * dp)


def batches(items: Sequence[Item], batch_size: int) -> list[list[Item]]:
    """Items grouped by shape (in order of first appearance), cut into runs of at most ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    groups: dict[tuple[int, ...], list[Item]] = {}
    for item in items:
        groups.setdefault(item.shape, []).append(item)
    return [group[i : i + batch_size] for group in groups.values() for i in range(0, len(group), batch_size)]
