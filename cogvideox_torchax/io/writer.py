"""The one writer of the commands' outputs: staged, written whole or while the device decodes, moved in or discarded.

`Writer` owns one group of outputs that succeed or fail together (a file's
videos, or one video of a many-latents run): their staged entries
(`outputs.StagedOutputs`), writing into them (`Writer.write` for a whole
array; `stream`, over one or several writers, for the chunks of
`TorchaxVAE.decode_stream`), and moving them in
(`commit`, inside the caller's ``atomic`` block: the commands defer a signal
until the renames are done) or removing them. The streamed write runs on a
thread fed by a bounded queue of decoded chunks, so host memory does not grow
with the video; a failing decode stops both, a failing video (its frames
not finite, or its writer) is dropped alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from cogvideox_torchax.io import latents, outputs, video

_DONE = object()


@dataclasses.dataclass(frozen=True)
class VideoOptions:
    """How videos are encoded: the mp4 frame rate, quality, encoder and its preset."""

    fps: float = 8.0
    crf: int = 18
    encoder: str = "libx264"
    preset: str | None = None


class Writer:
    """Outputs staged beside their destinations, written, then moved in together (`commit`) or removed.

    ``kind``: ``"mp4"``, ``"png"``, ``"npy"``, ``"safetensors"`` (decoded
    video), or ``"latents"`` (a latents file, `latents.save_latents_file`).
    Use as a context manager: leaving it without `commit` removes what was
    staged. ``atomic()`` wraps the renames (the commands defer signals
    there); ``committed`` collects the paths moved in.

    Raises:
        outputs.OutputError: a path that cannot be written or may not be replaced (nothing staged).
    """

    def __init__(self, paths: Sequence[str | os.PathLike], kind: str, *, overwrite: bool = False,
                 atomic: Callable[[], Any] = contextlib.nullcontext, committed: list[str] | None = None):
        self.kind, self._atomic = kind, atomic
        self.committed = committed if committed is not None else []
        is_dir = False if kind == "latents" else None
        self.staged = outputs.StagedOutputs(list(paths), overwrite=overwrite, is_dir=is_dir)

    @property
    def paths(self) -> list:
        return self.staged.paths

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.staged.__exit__(*exc)

    def write(self, i: int, data: np.ndarray, options: VideoOptions = VideoOptions(),
              tick: Callable[[], None] | None = None, metadata: dict[str, str] | None = None) -> None:
        """Writes output ``i`` whole: a video (floats ``(3, F, H, W)`` or uint8 frames) or, for latents, the array."""
        with outputs.disk_full_named(self.paths[i], data.nbytes):
            temp = self.staged.temps[i]
            if self.kind == "latents":
                latents.save_latents_file(temp, data, key="latents", metadata=metadata)
            else:
                video.write_video_to(temp, self.kind, data, fps=options.fps, crf=options.crf, tick=tick,
                                     encoder=options.encoder, preset=options.preset)

    def commit(self) -> None:
        """Moves every output in, or none (`StagedOutputs.commit`), inside ``atomic()``."""
        with self._atomic():
            self.staged.commit()
            self.committed.extend(str(p) for p in self.paths)


def stream(rows: Sequence[tuple[Writer, int] | None], chunks: Iterable[Any], options: VideoOptions = VideoOptions(),
           **feed: Any) -> StreamTimes:
    """Writes `VideoChunk` s as they come: video ``i`` into output ``rows[i]`` (writer, index); None: padding.

    ``feed``: `write_while_decoding`'s keywords besides the writers and the guard.
    """
    def open_writer(i: int) -> Any:
        if rows[i] is None:
            return None
        writer, j = rows[i]
        return video.FrameWriter(writer.staged.temps[j], writer.kind, fps=options.fps, crf=options.crf,
                                 encoder=options.encoder, preset=options.preset)

    def guard(i: int, n: int | None) -> Any:
        writer, j = rows[i]
        return outputs.disk_full_named(writer.paths[j], n)

    return write_while_decoding(chunks, open_writer, len(rows), guard=guard, **feed)


@dataclasses.dataclass(frozen=True)
class StreamTimes:
    """Seconds of a streamed write, from the first chunk's dispatch.

    Attributes:
        first_frame_s: until the first chunk's frames reached the host.
        decode_s: until the last chunk's frames reached the host.
        write_s: the writer's busy time (encoding and writing).
        end_to_end_s: until the last video was finished.
    """

    first_frame_s: float
    decode_s: float
    write_s: float
    end_to_end_s: float

    @property
    def write_hidden(self) -> float:
        """The share of the write that ran while the device decoded (0 to 1)."""
        if self.write_s <= 0:
            return 1.0
        return max(0.0, min(1.0, 1.0 - (self.end_to_end_s - self.decode_s) / self.write_s))

    def as_dict(self) -> dict[str, float]:
        return {
            "first_frame_s": round(self.first_frame_s, 3),
            "decode_s": round(self.decode_s, 3),
            "write_s": round(self.write_s, 3),
            "end_to_end_s": round(self.end_to_end_s, 3),
            "write_hidden": round(self.write_hidden, 3),
        }


def _no_op(*_: Any) -> None:
    return None


def write_while_decoding(
    chunks: Iterable[Any],
    open_writer: Callable[[int], Any],
    videos: int,
    *,
    on_decoded: Callable[[int], None] = _no_op,
    on_written: Callable[[], None] = _no_op,
    guard: Callable[[int, int | None], Any] = lambda i, n: contextlib.nullcontext(),
    poll: Callable[[], None] = _no_op,
    queue_size: int = 2,
    failed_video: Callable[[int, Exception | None], None] | None = None,
    stop_at_first: bool = False,
) -> StreamTimes:
    """Feeds each chunk's per-video frames to ``open_writer(i)``'s writer on a thread while the next chunk decodes.

    Args:
        chunks: `VideoChunk` s in order (``data`` uint8 ``(B, F, H, W, 3)``).
        open_writer: a `FrameWriter` for video ``i``, or None for a video not written (padding).
        videos: how many videos (``B``).
        on_decoded: called with each chunk's frame count; ``on_written``: after each frame written.
        guard: ``guard(i, nbytes)``, a context manager around writing video ``i`` (naming it on a full disk).
        poll: called while waiting on the queue (the commands raise a pending signal there).
        queue_size: chunks that may wait for the writer.
        failed_video: where given, a video whose frames are not finite (``None``) or whose writer raised (the
            error) is reported through it and written no more; the others go on, and the decode stops once no
            video is left to write (with ``stop_at_first``, at the first failure). Without it a writer's failure
            ends all (frames that are not finite are written as they come).

    Raises:
        Exception: whatever the decode or (without ``failed_video``) the writer raised (the first).
    """
    work: queue.Queue = queue.Queue(maxsize=queue_size)
    failed: list[BaseException] = []
    busy = [0.0]
    stop = threading.Event()  # with failed_video: no video is left to write (or, stop_at_first, one failed)
    report = failed_video
    if failed_video is not None and stop_at_first:
        def report(i: int, error: Exception | None) -> None:
            failed_video(i, error)
            stop.set()

    def writer() -> None:
        done = False
        try:
            with _Writers(open_writer, videos, guard, report) as writers:
                while not (done := (chunk := work.get()) is _DONE):
                    t = time.perf_counter()
                    for i, frames in enumerate(chunk.data):
                        writers.write(i, frames, bool(chunk.finite[i]), on_written)
                    busy[0] += time.perf_counter() - t
                    if not writers.left:
                        stop.set()
                t = time.perf_counter()
            busy[0] += time.perf_counter() - t  # closing flushes the encoders
        except BaseException as e:  # noqa: BLE001  (handed to the main thread, raised there)
            failed.append(e)
            while not done:  # let the main thread finish putting
                done = work.get() is _DONE

    thread = threading.Thread(target=writer, name="video-writer", daemon=True)
    start = time.perf_counter()
    first = None
    thread.start()
    try:
        for chunk in chunks:
            if first is None:
                first = time.perf_counter() - start
            on_decoded(chunk.frames * videos)
            poll()
            while not failed:
                try:
                    work.put(chunk, timeout=0.1)
                    break
                except queue.Full:
                    poll()
            if failed or stop.is_set():
                break
        decoded = time.perf_counter() - start
    finally:
        # The writer drains the queue after a failure, so this put always lands.
        while thread.is_alive():
            with contextlib.suppress(queue.Full):
                work.put(_DONE, timeout=0.1)
                break
        thread.join()
    if failed:
        raise failed[0]
    return StreamTimes(first or 0.0, decoded, busy[0], time.perf_counter() - start)


class _Writers:
    """One open writer per video; all closed on the way out (a failure's partial files are the caller's to drop).

    With ``failed_video`` a video's failure (opening, writing, closing, or
    frames that are not finite) closes and drops its writer only.
    """

    def __init__(self, open_writer: Callable[[int], Any], videos: int, guard: Callable[[int, int | None], Any],
                 failed_video: Callable[[int, Exception | None], None] | None):
        self._guard, self._failed = guard, failed_video
        self._writers: list[Any] = []
        for i in range(videos):
            try:
                self._writers.append(open_writer(i))
            except Exception as e:
                if failed_video is None:
                    self.__exit__(type(e), e, None)
                    raise
                self._writers.append(None)
                failed_video(i, e)

    @property
    def left(self) -> int:
        """How many videos are still written (padding is none)."""
        return sum(w is not None for w in self._writers)

    def __enter__(self) -> _Writers:
        return self

    def write(self, i: int, frames: Any, finite: bool, tick: Callable[[], None]) -> None:
        """Appends video ``i``'s frames (frames that are not finite: only with ``failed_video``, which drops it)."""
        writer = self._writers[i]
        if writer is None:
            return
        if self._failed is not None and not finite:
            self._drop(i, None)
            return
        try:
            with self._guard(i, frames.nbytes):
                writer.write(frames, tick)
        except Exception as e:
            if self._failed is None:
                raise
            self._drop(i, e)

    def _drop(self, i: int, error: Exception | None) -> None:
        writer, self._writers[i] = self._writers[i], None
        with contextlib.suppress(Exception):  # the video is failed already; its entry is the caller's to drop
            writer.close()
        self._failed(i, error)

    def __exit__(self, *exc: object) -> None:
        errors = []
        for i, w in enumerate(self._writers):
            if w is None:
                continue
            try:
                with self._guard(i, None):
                    w.close()
            except Exception as e:  # noqa: BLE001  (the first is raised below)
                if self._failed is not None:
                    self._writers[i] = None
                    self._failed(i, e)
                else:
                    errors.append(e)
        if errors and exc[0] is None:
            raise errors[0]
