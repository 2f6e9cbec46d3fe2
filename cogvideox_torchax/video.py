"""Writing decoded videos: H.264 mp4, PNG frame folders, raw float frames.

Every writer builds its output beside the destination under a temporary name
and renames it into place at the end, so a failed or interrupted run never
leaves a half-written video where the user asked for one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

FILE_SUFFIXES = (".mp4", ".npy", ".safetensors")
KINDS = ("mp4", "png", "npy", "safetensors")


class OutputError(ValueError):
    """An output path that cannot be written; the message says why."""


def output_kind(path: str | os.PathLike) -> str:
    """``"mp4"``, ``"npy"``, ``"safetensors"``, or ``"png"`` for a path without a suffix (a folder of frames).

    Raises:
        OutputError: any other suffix.
    """
    suffix = Path(path).suffix.lower()
    if suffix == "":
        return "png"
    if suffix not in FILE_SUFFIXES:
        raise OutputError(
            f"unknown output extension {suffix!r}; use .mp4, .npy, .safetensors, or a folder name (PNG frames)"
        )
    return suffix[1:]


def output_paths(path: str | os.PathLike, batch: int) -> list[Path]:
    """One output per video: the path itself for one video, ``name_0.ext``, ``name_1.ext``, ... for more."""
    path = Path(path)
    if batch == 1:
        return [path]
    return [path.with_name(f"{path.stem}_{i}{path.suffix}") for i in range(batch)]


def check_outputs(paths: list[Path], overwrite: bool) -> None:
    """Refuses outputs that exist (unless ``overwrite``) or whose folder is missing or read-only.

    Raises:
        OutputError: naming the first offending path.
    """
    for path in paths:
        if path.exists() and not overwrite:
            raise OutputError(f"output {str(path)!r} exists; pass --overwrite to replace it")
        parent = path.parent
        if not parent.is_dir():
            raise OutputError(f"output folder {str(parent)!r} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"output folder {str(parent)!r} is not writable")


def to_uint8(video: np.ndarray) -> np.ndarray:
    """Decoder output → frames as diffusers' video processor makes them.

    ``(B, 3, F, H, W)`` floats in about [-1, 1] → ``(B, F, H, W, 3)`` uint8,
    by ``round(clip(x / 2 + 0.5, 0, 1) * 255)`` (diffusers' ``denormalize``
    then ``numpy_to_pil``).
    """
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"expected a (B, 3, F, H, W) video, got shape {video.shape}")
    x = np.clip(video.astype(np.float32) * 0.5 + 0.5, 0.0, 1.0)
    return np.round(x * 255).astype(np.uint8).transpose(0, 2, 3, 4, 1)


@contextlib.contextmanager
def _atomic(path: Path, is_dir: bool = False) -> Iterator[Path]:
    parent = path.parent
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=parent)
        os.close(fd)
        tmp = Path(name)
    # mkstemp/mkdtemp create owner-only entries; give the output the
    # permissions a plain open() would have (the umask's).
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod((0o777 if is_dir else 0o666) & ~umask)
    try:
        yield tmp
        if is_dir and path.exists():
            # os.replace cannot put a folder over another; move the old one
            # aside first and drop it once the new one is in place.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink()


def atomic_output(path: Path, is_dir: bool = False) -> contextlib.AbstractContextManager[Path]:
    """A temporary path beside ``path``, renamed to ``path`` when the block ends without error (else removed).

    The same guarantee as this module's writers, for outputs written elsewhere
    (e.g. `latents.write_latents`).
    """
    return _atomic(path, is_dir)


def write_mp4(
    path: Path, frames: np.ndarray, fps: float = 8, crf: int = 18, tick: Callable[[], None] | None = None
) -> None:
    """Encodes ``(F, H, W, 3)`` uint8 frames as H.264 (PyAV's libx264).

    ``crf`` 18 is visually lossless and uses yuv420p, which every player
    reads; ``crf`` 0 switches to lossless yuv444p (only the RGB/YUV
    conversion rounds, by at most 2 levels).
    """
    import av

    _, height, width, _ = frames.shape
    with _atomic(path) as tmp:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=_fraction(fps))
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuv444p" if crf == 0 else "yuv420p"
            stream.options = {"crf": str(crf)}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                    container.mux(packet)
                if tick:
                    tick()
            for packet in stream.encode():
                container.mux(packet)


def _fraction(fps: float):
    from fractions import Fraction

    return Fraction(fps).limit_denominator(1001)


def read_mp4(path: str | os.PathLike) -> tuple[np.ndarray, float]:
    """Decodes an mp4 back to ``(F, H, W, 3)`` uint8 frames and its frame rate."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
        return frames, float(stream.average_rate)


def write_png_folder(path: Path, frames: np.ndarray, tick: Callable[[], None] | None = None) -> None:
    """Writes ``(F, H, W, 3)`` uint8 frames as ``path/frame_0000.png``, ..."""
    from PIL import Image

    with _atomic(path, is_dir=True) as tmp:
        for i, frame in enumerate(frames):
            Image.fromarray(frame, mode="RGB").save(tmp / f"frame_{i:04d}.png")
            if tick:
                tick()


def write_raw(path: Path, video: np.ndarray) -> None:
    """Writes one video's float frames ``(3, F, H, W)`` as .npy or .safetensors (key ``"video"``)."""
    with _atomic(path) as tmp:
        if path.suffix.lower() == ".npy":
            np.save(tmp, video)
        else:
            from safetensors.numpy import save_file

            save_file({"video": np.ascontiguousarray(video)}, str(tmp))


def write_video(
    path: Path,
    video: np.ndarray,
    *,
    fps: float = 8,
    crf: int = 18,
    tick: Callable[[], None] | None = None,
) -> None:
    """Writes one decoded video ``(3, F, H, W)`` (float, about [-1, 1]) in the kind ``path`` names.

    mp4 and PNG get uint8 frames as diffusers makes them (`to_uint8`);
    .npy and .safetensors get the float frames unchanged (unclamped).
    ``tick`` is called once per frame written (mp4, PNG) or once (raw).
    """
    kind = output_kind(path)
    if kind in ("npy", "safetensors"):
        write_raw(path, video)
        if tick:
            tick()
        return
    frames = to_uint8(video[None])[0]
    if kind == "mp4":
        write_mp4(path, frames, fps=fps, crf=crf, tick=tick)
    else:
        write_png_folder(path, frames, tick=tick)
