"""Reading videos to encode, and fitting them to what the VAE round-trips.

A video is an mp4 (any container PyAV reads: .mp4, .mov, .mkv, .webm) or a
folder of image frames taken in name order. Upstream's VAEs encode any size
and frame count, but only some come back unchanged through ``decode``; the
model family says which (`cogvideox_torchax.families.Family`), and `fit`
takes its spatial factor and frame rule:

* Height and width divisible by the spatial factor (8; 16 for Wan 2.2
  TI2V-5B's 2x2 patches): by default the frames are centre-cropped to the
  nearest such size below; a requested ``--size HxW`` is reached by scaling
  to cover it (Lanczos, as diffusers' video processor resizes) and
  centre-cropping.
* CogVideoX: a frame count ``8 k + 1`` (1, 9, ..., 49), encoded in batches
  of 8 after the first frame, ``2 k + 1`` latent frames that decode back to
  ``8 k + 1`` (49 -> 13 -> 49); any other count is encoded as upstream
  encodes it (5 frames -> 2 latent frames -> 8 decoded). Wan: ``4 k + 1``
  (1, 5, ..., 81), the first frame then chunks of 4, ``k + 1`` latent
  frames; upstream's encode reads no frame past the last whole chunk.
  By default the trailing frames beyond the largest such count are dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from cogvideox_torchax.io import paths

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
# CogVideoX's VAE (the defaults): 8x spatial compression, 4x temporal in batches of 8 frames.
SPATIAL_FACTOR = 8
FRAME_STEP = 8


class FramesError(ValueError):
    """A video that cannot be read or fitted; the message says why."""


def read_frames(path: str | os.PathLike) -> tuple[np.ndarray, float | None]:
    """Reads a video file or a folder of frames.

    Args:
        path: an mp4 (or .mov/.mkv/.webm) file, or a folder of .png/.jpg/...
            frames (read in sorted name order; entries under other names
            are ignored, and one under a frame's name that is no file, such
            as a folder or a link that leads nowhere, is refused).

    Returns:
        ``(F, H, W, 3)`` uint8 RGB frames, and the frame rate (None for a
        folder).

    Raises:
        FramesError: missing path, unknown file type, unreadable file or
            image, an entry under a frame's name that is no file, no frames,
            or frames of different sizes.
    """
    path = Path(path)
    if os.path.isdir(path):
        return _read_folder(path), None
    problem = paths.not_a_file(path)  # never opened otherwise: a FIFO would block the decoder
    if problem == "does not exist":
        raise FramesError(f"no such video or frame folder: {str(path)!r}")
    if problem is not None:
        raise FramesError(f"video {str(path)!r} {problem}")
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise FramesError(
            f"cannot read {str(path)!r}: expected a video ({', '.join(VIDEO_SUFFIXES)}) or a folder of frames"
        )
    return _read_video(path)


def _read_video(path: Path) -> tuple[np.ndarray, float | None]:
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise FramesError(f"{str(path)!r} has no video stream")
            stream = container.streams.video[0]
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
            fps = float(stream.average_rate) if stream.average_rate else None
    except (FramesError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001  (PyAV's and FFmpeg's classes, whatever they are: a bad file)
        raise FramesError(f"cannot decode video {str(path)!r}: {_describe(e)}") from e
    if not frames:
        raise FramesError(f"video {str(path)!r} has no frames")
    return np.stack(frames), fps


def _describe(e: Exception) -> str:
    # The decoders' own messages, with the class where they say little.
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _read_folder(folder: Path) -> np.ndarray:
    from PIL import Image

    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if Path(e.name).suffix.lower() in IMAGE_SUFFIXES)
    except OSError as e:
        raise FramesError(f"folder {str(folder)!r} cannot be listed: {e.strerror}") from None
    if not names:
        raise FramesError(f"folder {str(folder)!r} holds no frames ({', '.join(IMAGE_SUFFIXES)})")
    frames = []
    for f in (folder / name for name in names):
        # Every entry under a frame's name is a frame: one that is no file is named, never passed over.
        problem = paths.not_a_file(f)
        if problem is not None:
            raise FramesError(f"frame {str(f)!r} {problem}")
        try:
            with Image.open(f) as im:
                frame = _to_rgb8(im, f)
        except (FramesError, MemoryError):
            raise
        # Pillow's classes and its plugins' (DecompressionBombError, whose
        # message names the pixel limit, is neither OSError nor ValueError).
        except Exception as e:  # noqa: BLE001
            raise FramesError(f"cannot read frame {str(f)!r}: {_describe(e)}") from e
        if frames and frame.shape != frames[0].shape:
            h, w = frames[0].shape[:2]
            raise FramesError(f"frame {str(f)!r} is {frame.shape[0]}x{frame.shape[1]} (HxW), the first frame {h}x{w}")
        frames.append(frame)
    return np.stack(frames)


# Pillow's 16-bit integer modes (a 16-bit grayscale PNG opens as one of these).
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def _to_rgb8(im, path: Path) -> np.ndarray:
    """One image as ``(H, W, 3)`` uint8 RGB, the way diffusers' video processor takes an image.

    8-bit modes (L, P, RGB, RGBA, LA, CMYK, YCbCr, 1, ...) go through
    ``convert("RGB")`` as diffusers does (alpha dropped, palettes
    expanded). 16-bit grayscale is scaled to 8 bits (``v / 257``, rounded),
    which ``convert`` would clip instead (mid-grey read as white); 32-bit
    integer images are read so when every value is within 16 bits. Other
    modes (float ``F``, wider integers) are refused by name.

    Raises:
        FramesError: a mode with no faithful 8-bit reading.
    """
    mode = im.mode
    if mode in _SIXTEEN_BIT or mode == "I":
        values = np.asarray(im, dtype=np.int64)
        if values.min() < 0 or values.max() > 65535:
            raise FramesError(f"frame {str(path)!r} is a 32-bit integer image ({mode}) with values beyond 16 bits; "
                              "save the frames as 8- or 16-bit")
        grey = np.round(values / 257.0).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=-1)
    if mode == "F":
        raise FramesError(f"frame {str(path)!r} is a 32-bit float image (mode F), which has no 8-bit reading; "
                          "save the frames as 8- or 16-bit")
    return np.asarray(im.convert("RGB"))


def parse_size(text: str) -> tuple[int, int]:
    """``"480x720"`` (height x width) -> ``(480, 720)``; each must be a positive multiple of 8.

    Raises:
        FramesError: anything else.
    """
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise FramesError(f"size must look like HEIGHTxWIDTH, e.g. 480x720; got {text!r}")
    height, width = (int(p) for p in parts)
    if min(height, width) < SPATIAL_FACTOR or height % SPATIAL_FACTOR or width % SPATIAL_FACTOR:
        raise FramesError(f"size {height}x{width}: height and width must be positive multiples of {SPATIAL_FACTOR}")
    return height, width


def default_frame_count(available: int, step: int = FRAME_STEP) -> int:
    """The largest ``step k + 1`` not above ``available`` (CogVideoX's ``8 k + 1``: the counts that decode back)."""
    if available < 1:
        raise FramesError("the video has no frames")
    return (available - 1) // step * step + 1


def fit(frames: np.ndarray, *, size: tuple[int, int] | None = None, num_frames: int | None = None,
        spatial: int = SPATIAL_FACTOR, frame_step: int = FRAME_STEP) -> np.ndarray:
    """Keeps the first ``num_frames`` frames and brings them to ``size``.

    Args:
        frames: ``(F, H, W, 3)`` uint8.
        size: ``(height, width)``, multiples of ``spatial``, reached by
            scaling to cover and centre-cropping; None centre-crops to the
            multiples of ``spatial`` below the frames' own size.
        num_frames: how many leading frames to keep; None for
            `default_frame_count` with ``frame_step``.
        spatial: the model's spatial factor (8; 16 for Wan 2.2 TI2V-5B).
        frame_step: the model's frame step (CogVideoX 8, Wan 4).

    Returns:
        ``(num_frames, height, width, 3)`` uint8.

    Raises:
        FramesError: more frames asked for than there are, frames smaller
            than the spatial factor with no ``size``, or a bad ``size``.
    """
    available, height, width = frames.shape[:3]
    count = default_frame_count(available, frame_step) if num_frames is None else num_frames
    if not 1 <= count <= available:
        raise FramesError(f"cannot take {count} frames from a video of {available}")
    frames = frames[:count]
    if size is None:
        target = (height // spatial * spatial, width // spatial * spatial)
        if min(target) < spatial:
            raise FramesError(f"frames are {height}x{width} (HxW); the VAE needs at least {spatial}x{spatial}")
    else:
        target = size
        if min(target) < spatial or target[0] % spatial or target[1] % spatial:
            raise FramesError(f"size {target[0]}x{target[1]}: height and width must be positive multiples of "
                              f"{spatial} for this model")
        frames = _resize_to_cover(frames, target)
    return _center_crop(frames, target)


def fit_bytes(shape: tuple[int, ...], *, size: tuple[int, int] | None = None, num_frames: int | None = None,
              spatial: int = SPATIAL_FACTOR, frame_step: int = FRAME_STEP) -> int:
    """The most host memory `fit` and `to_video_tensor` take for frames of ``shape`` ``(F, H, W, 3)``.

    The scaled frames (uint8), their crop, and the float32 video with its
    intermediate copies; what the encode command checks against the host's
    available memory before fitting (a ``--size`` of 100000x100000 must not
    end in a MemoryError).
    """
    available, height, width = shape[:3]
    count = min(available, default_frame_count(available, frame_step) if num_frames is None else num_frames)
    target = size or (height // spatial * spatial, width // spatial * spatial)
    scaled = _cover_size((height, width), target) if size is not None else (height, width)
    per_frame = scaled[0] * scaled[1] * 3 + target[0] * target[1] * 3 * (1 + 3 * 4)
    return int(count) * int(per_frame)


def _cover_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    # Rounded up so the scaled frame covers the target on both axes.
    height, width = size
    scale = max(target[0] / height, target[1] / width)
    return max(target[0], round(height * scale)), max(target[1], round(width * scale))


def _resize_to_cover(frames: np.ndarray, target: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    height, width = frames.shape[1:3]
    new_h, new_w = _cover_size((height, width), target)
    if (new_h, new_w) == (height, width):
        return frames
    resample = Image.Resampling.LANCZOS
    return np.stack([np.asarray(Image.fromarray(f).resize((new_w, new_h), resample)) for f in frames])


def _center_crop(frames: np.ndarray, target: tuple[int, int]) -> np.ndarray:
    height, width = frames.shape[1:3]
    top, left = (height - target[0]) // 2, (width - target[1]) // 2
    return frames[:, top : top + target[0], left : left + target[1]]


def to_video_tensor(frames: np.ndarray) -> np.ndarray:
    """``(F, H, W, 3)`` uint8 -> ``(1, 3, F, H, W)`` float32 in [-1, 1], as diffusers' video processor makes it."""
    x = frames.astype(np.float32) / np.float32(255.0)
    x = x * np.float32(2.0) - np.float32(1.0)
    return np.ascontiguousarray(x.transpose(3, 0, 1, 2)[None])
