"""Writing the videos while the device decodes: a writer thread fed by a bounded queue of decoded batches.

The main thread takes each latent frame batch's frames off the device
(`TorchaxVAE.decode_stream`) and queues them; the writer thread appends them
to every video's staged entry (`io.video.FrameWriter`: libx264 runs its own
threads). At most ``queue_size`` batches wait on the host, so host memory
does not grow with the video. A failure on either side stops both: the
staged entries are then discarded by their owner, nothing is moved in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_DONE = object()


@dataclasses.dataclass(frozen=True)
class StreamTimes:
    """Seconds of a streamed run, from the first batch's dispatch.

    Attributes:
        first_frame_s: until the first batch's frames reached the host.
        decode_s: until the last batch's frames reached the host.
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


def write_while_decoding(
    chunks: Iterable[Any],
    open_writer: Callable[[int], Any],
    videos: int,
    *,
    check: Callable[[Any], None],
    on_decoded: Callable[[int], None],
    on_written: Callable[[], None],
    guard: Callable[[int, int], Any],
    queue_size: int = 2,
    failed_video: Callable[[int, Exception | None], None] | None = None,
) -> StreamTimes:
    """Feeds each chunk's per-video frames to ``open_writer(i)``'s writer on a thread while the next chunk decodes.

    Args:
        chunks: `VideoChunk` s in order (``data`` uint8 ``(B, F, H, W, 3)``).
        open_writer: a `FrameWriter` for video ``i``, or None for a video
            not written (a batch's padding).
        videos: how many videos (``B``).
        check: called on each chunk before it is queued (raises to stop,
            e.g. on frames that were not finite).
        on_decoded: called with each chunk's frame count (the decode bar).
        on_written: called after each frame written (the write bar).
        guard: ``guard(i, nbytes)``, a context manager around writing
            ``nbytes`` of video ``i`` (naming the output on a full disk).
        queue_size: batches that may wait for the writer.
        failed_video: where given, one video's failure ends only that video:
            a video whose frames are not finite (``None``) or whose writer
            raised (the error) is reported through it and written no more,
            and the others go on. Without it any failure ends the run.

    Returns:
        The run's `StreamTimes`.

    Raises:
        Whatever the decode, ``check`` or the writer raised (the first).
    """
    from cogvideox_torchax.cli import interrupts

    work: queue.Queue = queue.Queue(maxsize=queue_size)
    failed: list[BaseException] = []
    busy = [0.0]

    def writer() -> None:
        done = False
        try:
            with _Writers(open_writer, videos, guard, failed_video) as writers:
                while not (done := (chunk := work.get()) is _DONE):
                    t = time.perf_counter()
                    for i, frames in enumerate(chunk.data):
                        writers.write(i, frames, bool(chunk.finite[i]), on_written)
                    busy[0] += time.perf_counter() - t
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
            check(chunk)
            on_decoded(chunk.frames * videos)
            interrupts.check_interrupted()
            while not failed:
                try:
                    work.put(chunk, timeout=0.1)
                    break
                except queue.Full:
                    interrupts.check_interrupted()
            if failed:
                break
        decoded = time.perf_counter() - start
    finally:
        _put_done(work, thread)
    if failed:
        raise failed[0]
    return StreamTimes(first or 0.0, decoded, busy[0], time.perf_counter() - start)


def _put_done(work: queue.Queue, thread: threading.Thread) -> None:
    # The writer drains the queue after a failure, so this put always lands.
    while thread.is_alive():
        try:
            work.put(_DONE, timeout=0.1)
            break
        except queue.Full:
            continue
    thread.join()


class _Writers:
    """One open writer per video; all closed on the way out (a failure's partial files are the caller's to drop).

    With ``failed_video`` a video's failure (opening, writing, closing, or
    frames that are not finite) closes and drops its writer only.
    """

    def __init__(self, open_writer: Callable[[int], Any], videos: int, guard: Callable[[int, int], Any],
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


def staged_writers(temps: list[Path | None], kind: str, **writer_options: Any) -> Callable[[int], Any]:
    """``open_writer`` for `write_while_decoding`: a `FrameWriter` into each staged entry (None: not written)."""
    from cogvideox_torchax.io.video import FrameWriter

    return lambda i: None if temps[i] is None else FrameWriter(temps[i], kind, **writer_options)
