"""The streamed write's failures (`io.writer.write_while_decoding`): one video's is its own; none left, the decode stops."""

import types

import numpy as np
import pytest

from cogvideox_torchax.io.writer import write_while_decoding


class _Frames:
    """A writer that keeps what it is given; ``fails``: raises on its first write."""

    def __init__(self, fails: bool = False):
        self.fails, self.written, self.closed = fails, 0, False

    def write(self, frames, tick):
        if self.fails:
            raise OSError("disk said no")
        self.written += len(frames)

    def close(self):
        self.closed = True


def _chunks(count: int, videos: int, nan_in: int | None = None, taken: list | None = None):
    """``count`` chunks of 2 frames per video; video ``nan_in``'s frames not finite from the first; counts takes."""
    for n in range(count):
        if taken is not None:
            taken.append(n)
        finite = np.array([i != nan_in for i in range(videos)])
        yield types.SimpleNamespace(data=np.zeros((videos, 2, 4, 4, 3), np.uint8), finite=finite, frames=2)


@pytest.mark.parametrize("nan_in", [None, 0])
def test_a_videos_failure_is_its_own_and_the_others_are_written_whole(nan_in):
    writers = [_Frames(fails=nan_in is None), _Frames()]
    failed: dict[int, Exception | None] = {}
    write_while_decoding(_chunks(5, 2, nan_in), writers.__getitem__, 2, failed_video=failed.__setitem__)
    assert list(failed) == [0] and (failed[0] is None) == (nan_in == 0)
    assert writers[0].closed and writers[1].written == 10 and writers[1].closed


@pytest.mark.parametrize("nan_in", [None, 0])
def test_the_decode_stops_once_no_video_is_left_to_write(nan_in):
    taken: list[int] = []
    writer = _Frames(fails=nan_in is None)
    failed: dict[int, Exception | None] = {}
    write_while_decoding(_chunks(50, 1, nan_in, taken), lambda i: writer, 1, failed_video=failed.__setitem__,
                         queue_size=1)
    assert list(failed) == [0]
    # The first chunk fails the only video; at most the queue's and the writer's chunks are decoded after it.
    assert len(taken) <= 4


def test_without_failed_video_the_first_failure_ends_all():
    with pytest.raises(OSError, match="disk said no"):
        write_while_decoding(_chunks(5, 2), [_Frames(fails=True), _Frames()].__getitem__, 2)


def test_stop_at_first_ends_the_decode_at_the_first_failure():
    # One file's videos are written together: the first failure ends its decode though another video is left.
    taken: list[int] = []
    failed: dict[int, Exception | None] = {}
    writers = [_Frames(), _Frames()]
    write_while_decoding(_chunks(50, 2, 0, taken), writers.__getitem__, 2, failed_video=failed.__setitem__,
                         stop_at_first=True, queue_size=1)
    assert list(failed) == [0] and len(taken) <= 4 and writers[1].closed
