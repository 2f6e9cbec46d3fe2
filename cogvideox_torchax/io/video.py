"""The video codecs: H.264 mp4 (PyAV), PNG frame folders, raw float frames, and one way to write a video.

`write_video_to` writes one video into a path it is given, which the
caller has staged (`cogvideox_torchax.io.outputs.StagedOutputs`): staging
and moving outputs in is `outputs`' job, not a codec's.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


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


# libx264 refuses frames wider or taller than this (tried: 16384 encodes, 16392 does not).
H264_MAX_SIDE = 16384


def check_mp4_size(height: int, width: int) -> None:
    """Refuses frames H.264 (libx264) cannot take, before anything is decoded.

    Raises:
        ValueError: naming the limit and the outputs that take any size.
    """
    if max(height, width) > H264_MAX_SIDE:
        raise ValueError(
            f"frames of {height}x{width} are too large for H.264 (libx264 takes at most {H264_MAX_SIDE} pixels a "
            "side); write PNG frames (an output name without a suffix, or --format png) or .npy / .safetensors"
        )


def encode_mp4(dest: Path, frames: np.ndarray, fps: float = 8, crf: int = 18, tick=None) -> None:
    """Encodes ``(F, H, W, 3)`` uint8 frames as H.264 at ``dest`` itself (no staging)."""
    import av

    _, height, width, _ = frames.shape
    with av.open(str(dest), mode="w", format="mp4") as container:
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


def save_png_frames(dest: Path, frames: np.ndarray, tick=None) -> None:
    """Writes ``(F, H, W, 3)`` uint8 frames as ``dest/frame_0000.png``, ... into an existing folder."""
    from PIL import Image

    for i, frame in enumerate(frames):
        Image.fromarray(frame, mode="RGB").save(dest / f"frame_{i:04d}.png")
        if tick:
            tick()


def save_raw(dest: Path, video: np.ndarray, kind: str) -> None:
    """Writes float frames at ``dest`` itself as ``kind`` ``"npy"`` or ``"safetensors"`` (key ``"video"``)."""
    if kind == "npy":
        with open(dest, "wb") as f:  # a file object: np.save adds no suffix
            np.save(f, video)
    else:
        from safetensors.numpy import save_file

        save_file({"video": np.ascontiguousarray(video)}, str(dest))


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


def write_video_to(
    dest: Path, kind: str, video: np.ndarray, *, fps: float = 8, crf: int = 18, tick=None
) -> None:
    """Writes one video at ``dest`` itself (a staged temporary entry) as ``kind``.

    ``video`` is decoded floats ``(3, F, H, W)``, or for mp4 and PNG also
    frames already made (uint8 ``(F, H, W, 3)``, `to_uint8`'s result, as
    `TorchaxVAE.decode_frames_jax` makes them on device).
    """
    if kind in ("npy", "safetensors"):
        save_raw(dest, video, kind)
        if tick:
            tick()
        return
    frames = video if video.dtype == np.uint8 else to_uint8(video[None])[0]
    if kind == "mp4":
        encode_mp4(dest, frames, fps=fps, crf=crf, tick=tick)
    else:
        save_png_frames(dest, frames, tick=tick)
