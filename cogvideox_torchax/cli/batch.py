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
    """Files named, ``*.safetensors`` of folders named, and glob matches, in order, each once.

    Raises:
        InputsError: a name that is neither a file nor a folder nor a
            pattern matching a file; a folder or pattern with no latents.
    """
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            # Links that lead nowhere and special files are kept, to be reported
            # as unreadable (`latents.read_latents` never opens them); subfolders are not inputs.
            matches = sorted(p for p in path.glob("*.safetensors") if not p.is_dir())
            if not matches:
                raise InputsError(f"folder {spec!r} holds no .safetensors files")
        elif path.is_file():
            matches = [path]
        elif _GLOB_CHARS & set(spec):
            matches = sorted(Path(p) for p in glob.glob(spec) if not Path(p).is_dir())
            if not matches:
                raise InputsError(f"pattern {spec!r} matches no file")
        else:
            raise InputsError(f"latents file {spec!r} does not exist")
        found.extend(matches)
    unique: dict[str, Path] = {}
    for path in found:
        unique.setdefault(os.path.realpath(path), path)
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
