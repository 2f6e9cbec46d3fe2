"""The mp4 writer's settings tried against a stand-in device: libx264's options, threading, and closed-GOP segments.

Each setting is a name and a way to open a writer for one video (the
`FrameWriter` interface: ``write(frames)``, ``close()``, ``count`` frames
given and ``encoded`` frames in the file; ``held``, where a writer has
it, the frames that wait for a later frame before their encode starts). ``default`` is the decode
command's writer; ``before`` is the writer before it took
`X264_LOW_DELAY` (libx264's own lookahead of 40 at its default preset).

`SegmentedWriter` is the structure that was measured and not kept: the
video cut into closed-GOP segments, each encoded by an encoder of its own
on a pool of threads, their packets joined into one H.264 stream of one
mp4 (no re-encode: every segment's encoder makes the same SPS and PPS, and
its timestamps are moved by the segment's first frame).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from cogvideox_torchax.io.video import FrameWriter, _fraction

# libx264's own behaviour, as the writer had it before X264_LOW_DELAY (PyAV's sliced threads included).
BEFORE = {"rc-lookahead": None, "x264-params": None}


class FrameThreads(FrameWriter):
    """`FrameWriter` with libx264's frame threads (1.5 per core) instead of sliced threads."""

    def _open(self, height: int, width: int) -> None:
        super()._open(height, width)
        self._stream.codec_context.thread_type = "FRAME"  # the codec opens at the first frame, after this


class SegmentedWriter:
    """One mp4 from closed-GOP segments encoded on ``workers`` threads at once, joined as they finish in order.

    The first segment is ``1 + segment`` frames and every later one
    ``segment`` frames (CogVideoX's and Wan's batches end there when
    ``segment`` is a multiple of 8 or 4), so a segment is complete, and
    encoded, as soon as the device's batch that ends it has arrived.
    Each segment's encoder runs ``options`` (crf, preset, ...) with
    ``threads`` sliced threads. At most ``workers`` segments are in
    flight; `write` waits for the oldest beyond that.
    """

    def __init__(self, dest: Path, *, fps: float = 8, crf: int = 18, segment: int = 8, workers: int = 2,
                 threads: int = 0, options: dict[str, str | None] | None = None):
        self.dest, self.fps, self.segment, self.workers, self.threads = Path(dest), fps, segment, workers, threads
        given = {"crf": str(crf), **(options if options is not None else BEFORE)}
        self.options = {k: v for k, v in given.items() if v is not None}
        self.count = self.encoded = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="segment")
        self._frames: list[np.ndarray] = []
        self._start = 0  # first frame of the segment being gathered
        self._pending: collections.deque = collections.deque()  # (first frame, future of (extradata, packets))
        self._container = self._stream = None

    def _context(self, height: int, width: int):
        import av
        from av.codec.context import Flags

        ctx = av.codec.CodecContext.create("libx264", "w")
        ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
        ctx.time_base = _fraction(self.fps) ** -1
        ctx.framerate = _fraction(self.fps)
        ctx.flags |= int(Flags.global_header)  # SPS and PPS in the extradata (mp4's avcC), as the muxer's own
        ctx.thread_type, ctx.thread_count = "SLICE", self.threads
        ctx.options = dict(self.options)
        ctx.open()
        return ctx

    def _encode(self, frames: list[np.ndarray]) -> tuple[bytes, list[Any]]:
        import av

        ctx = self._context(*frames[0].shape[:2])
        packets = []
        for i, frame in enumerate(frames):
            video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            video_frame.pts, video_frame.time_base = i, ctx.time_base
            packets += ctx.encode(video_frame)
        packets += ctx.encode(None)
        return ctx.extradata, packets

    def _join(self, start: int, extradata: bytes, packets: list[Any], shape: tuple[int, int]) -> None:
        import av

        if self._container is None:
            self._container = av.open(str(self.dest), mode="w", format="mp4")
            self._stream = self._container.add_stream("libx264", rate=_fraction(self.fps))
            self._stream.height, self._stream.width = shape
            self._stream.pix_fmt = "yuv420p"
            self._stream.codec_context.thread_type, self._stream.codec_context.thread_count = "SLICE", self.threads
            self._stream.options = dict(self.options)
        for packet in packets:
            packet.pts += start
            packet.dts += start
            packet.stream = self._stream
            self._container.mux(packet)  # the first opens the stream's own encoder: the same SPS and PPS
            self.encoded += 1
        if self._stream.codec_context.extradata != extradata:
            raise RuntimeError(f"segment at frame {start}: its SPS/PPS differ from the stream's; it cannot be joined")

    def _submit(self) -> None:
        while len(self._pending) >= self.workers:
            start, future, shape = self._pending.popleft()
            self._join(start, *future.result(), shape)
        frames, self._frames = self._frames, []
        shape = frames[0].shape[:2]
        future = self._pool.submit(self._encode, frames)
        self._pending.append((self._start, future, shape))
        self._start += len(frames)

    @property
    def held(self) -> int:
        """Frames given that wait for a later frame before their encode can start: the segment being gathered."""
        return len(self._frames)

    def _join_done(self, wait: bool) -> None:
        while self._pending and (wait or self._pending[0][1].done()):
            start, future, shape = self._pending.popleft()
            self._join(start, *future.result(), shape)

    def write(self, frames: np.ndarray, tick: Callable[[], None] | None = None) -> None:
        for frame in frames:
            self._frames.append(frame)
            self.count += 1
            if len(self._frames) == self.segment + (1 if self._start == 0 else 0):
                self._submit()
            if tick:
                tick()
        self._join_done(wait=False)

    def close(self) -> None:
        try:
            if self._frames:
                self._submit()
            self._join_done(wait=True)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            if self._container is not None:
                self._container.close()
                self._container = None


# name -> (what it is, how a writer is opened: (dest, crf, cores) -> writer)
SETTINGS: dict[str, tuple[str, Callable[[Path, int, int], Any]]] = {
    "default": ("the decode command's writer: libx264 at its preset, rc-lookahead 3, force-cfr, sliced threads",
                lambda dest, crf, cores: FrameWriter(dest, "mp4", crf=crf)),
    "before": ("the writer before: libx264's own lookahead (40 at medium), sliced threads",
               lambda dest, crf, cores: FrameWriter(dest, "mp4", crf=crf, options=BEFORE)),
    "lookahead-8": ("rc-lookahead 8, force-cfr, sliced threads",
                    lambda dest, crf, cores: FrameWriter(dest, "mp4", crf=crf, options={"rc-lookahead": "8"})),
    "no-mbtree": ("no lookahead and no macroblock tree, 3 B-frames always (b-adapt 0), force-cfr",
                  lambda dest, crf, cores: FrameWriter(
                      dest, "mp4", crf=crf, options={"rc-lookahead": "0", "x264-params": "force-cfr=1:b-adapt=0"})),
    "zerolatency": ("tune=zerolatency: no lookahead, no macroblock tree, no B-frames, sliced threads",
                    lambda dest, crf, cores: FrameWriter(
                        dest, "mp4", crf=crf, options={**BEFORE, "tune": "zerolatency"})),
    "frame-threads": ("the writer before, with frame threads (1.5 per core) instead of sliced threads",
                      lambda dest, crf, cores: FrameThreads(dest, "mp4", crf=crf, options=BEFORE)),
    "one-thread": ("the writer before on one thread", lambda dest, crf, cores: FrameWriter(
        dest, "mp4", crf=crf, options=BEFORE, threads=1)),
    **{f"segments-{n}": (f"closed-GOP segments of {n} frames (the first 1 + {n}), one encoder each (the writer "
                         "before's settings, sliced threads), as many at once as cores",
                         lambda dest, crf, cores, n=n: SegmentedWriter(dest, crf=crf, segment=n, workers=cores))
       for n in (8, 16, 24)},
}
