"""The video codecs: H.264 mp4 (PyAV), PNG frame folders, raw float frames, and one way to write a video.

`write_video_to` writes one video into a path it is given, which the
caller has staged (`cogvideox_torchax.io.outputs.StagedOutputs`): staging
and moving outputs in is `outputs`' job, not a codec's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from cogvideox_torchax.io import paths


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


# H.264 encoders PyAV may offer: libx264 (the CPU, the default) and NVIDIA's
# NVENC (needs an NVIDIA GPU and driver where it runs).
ENCODERS = ("libx264", "h264_nvenc")
# libx264's presets, fastest first ("medium" is its default).
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")


def check_encoder(encoder: str) -> None:
    """Opens ``encoder`` on a tiny frame, so one that cannot run here is refused before anything is decoded.

    Raises:
        ValueError: an unknown encoder, or one this machine cannot start (the
            reason the codec library gave).
    """
    import av

    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, got {encoder!r}")
    if encoder not in av.codecs_available:
        raise ValueError(f"{encoder} is not part of this PyAV's FFmpeg build")
    try:
        context = av.codec.CodecContext.create(encoder, "w")
        context.width, context.height, context.pix_fmt = 64, 64, "yuv420p"
        context.time_base = _fraction(8) ** -1
        context.open()
    except Exception as e:  # the codec library's own error, e.g. no NVIDIA driver
        hint = " (NVENC needs an NVIDIA GPU and its driver on this machine)" if "nvenc" in encoder else ""
        raise ValueError(f"the {encoder} encoder cannot start here{hint}: {e}") from None


# What libx264 is told besides --crf and --preset, and why. It holds back frames before it encodes
# one: rc-lookahead of them (40 at its default preset, medium) for its macroblock tree, or its
# B-frames' 3 where that is more, and one more while it may not assume a constant frame rate. Behind a
# device that hands frames over batch by batch, a short video then waits whole in that lookahead
# and is encoded after its last frame arrived (on an H100 the writer ended 1.15 s after the decode).
# A lookahead of 3 and regular timestamps (force-cfr: the frames come at --fps) hold back 3 frames,
# as the B-frames alone would, and keep the tree. What it costs in size and quality:
# docs/results/writer-pace-cpu.md.
X264_LOW_DELAY = {"rc-lookahead": "3", "x264-params": "force-cfr=1"}
# Threads over slices of each frame, never over frames: frame threads would hold back a frame
# more per thread (libx264 starts 1.5 per core).
X264_THREAD_TYPE = "SLICE"


class FrameWriter:
    """Writes one video's uint8 frames ``(F, H, W, 3)`` as they come: an H.264 mp4, or a folder of PNG files.

    ``dest`` is written as it is (a staged entry: the caller moves it in);
    `close` (or leaving the ``with`` block) finishes the file. libx264 is
    given `X264_LOW_DELAY` and sliced threads, so that it encodes frames as
    they come rather than after the last; ``options`` adds to or replaces
    (a value of None: removes) what it is given, ``threads`` its thread
    count (0: one per core it may run on).
    """

    def __init__(self, dest: Path, kind: str, *, fps: float = 8, crf: int = 18, encoder: str = "libx264",
                 preset: str | None = None, options: Mapping[str, str | None] | None = None, threads: int = 0):
        if kind not in ("mp4", "png"):
            raise ValueError(f"FrameWriter writes mp4 or png, got {kind!r}")
        self.dest, self.kind, self.fps, self.crf = Path(dest), kind, fps, crf
        self.encoder, self.preset, self.threads = encoder, preset, threads
        self.options = dict(options or {})
        self.count = 0  # frames given
        self.encoded = 0  # mp4 frames the encoder has handed back (count - encoded: held back)
        self._container = self._stream = None

    def encoder_options(self) -> dict[str, str]:
        """The options the encoder is opened with."""
        if self.encoder == "libx264":
            given = {"crf": str(self.crf), **({"preset": self.preset} if self.preset else {}), **X264_LOW_DELAY}
        else:  # NVENC: constant quality at the same number
            given = {"rc": "vbr", "cq": str(self.crf), **({"preset": self.preset} if self.preset else {})}
        given.update(self.options)
        return {k: v for k, v in given.items() if v is not None}

    def _open(self, height: int, width: int) -> None:
        import av

        self._container = av.open(str(self.dest), mode="w", format="mp4")
        self._stream = self._container.add_stream(self.encoder, rate=_fraction(self.fps))
        self._stream.width, self._stream.height = width, height
        lossless = self.crf == 0 and self.encoder == "libx264"
        self._stream.pix_fmt = "yuv444p" if lossless else "yuv420p"
        if self.encoder == "libx264":
            self._stream.codec_context.thread_type = X264_THREAD_TYPE
            self._stream.codec_context.thread_count = self.threads
        self._stream.options = self.encoder_options()

    def write(self, frames: np.ndarray, tick=None) -> None:
        """Appends ``frames`` (uint8 ``(F, H, W, 3)``); ``tick()`` after each."""
        for frame in frames:
            if self.kind == "png":
                from PIL import Image

                Image.fromarray(frame, mode="RGB").save(self.dest / f"frame_{self.count:04d}.png")
            else:
                if self._container is None:
                    self._open(frame.shape[0], frame.shape[1])
                import av

                video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
                for packet in self._stream.encode(video_frame):
                    self._container.mux(packet)
                    self.encoded += 1
            self.count += 1
            if tick:
                tick()

    def close(self) -> None:
        """Flushes the encoder and closes the file (nothing to do for PNG)."""
        if self._container is not None:
            try:
                for packet in self._stream.encode():
                    self._container.mux(packet)
                    self.encoded += 1
            finally:
                self._container.close()
                self._container = None

    def __enter__(self) -> FrameWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_mp4(dest: Path, frames: np.ndarray, fps: float = 8, crf: int = 18, tick=None) -> None:
    """Encodes ``(F, H, W, 3)`` uint8 frames as H.264 at ``dest`` itself (no staging)."""
    with FrameWriter(dest, "mp4", fps=fps, crf=crf) as writer:
        writer.write(frames, tick)


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
    """Decodes an mp4 back to ``(F, H, W, 3)`` uint8 frames and its frame rate.

    Raises:
        ValueError: ``path`` is no regular file (looked at before it is opened: a FIFO would block).
    """
    import av

    problem = paths.not_a_file(path)
    if problem:
        raise ValueError(f"{str(path)!r} {problem}")
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
        return frames, float(stream.average_rate)


def write_video_to(
    dest: Path, kind: str, video: np.ndarray, *, fps: float = 8, crf: int = 18, tick=None,
    encoder: str = "libx264", preset: str | None = None,
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
    with FrameWriter(dest, kind, fps=fps, crf=crf, encoder=encoder, preset=preset) as writer:
        writer.write(frames, tick)
