"""Wan's `decode_stream`: 1 frame for the first latent frame, 4 for each later one, equal to the whole decode."""

import jax
import numpy as np
import pytest

import cogvideox_torchax as ct


def _z(t, batch=1, seed=0, size=(3, 5), channels=16):
    return np.random.default_rng(seed + t).standard_normal((batch, channels, t, *size)).astype(np.float32)


@pytest.mark.parametrize("t", [1, 2, 5])
def test_wan_streamed_frames_and_video_equal_the_whole_decode_exactly(wan_tiny, t):
    # fp32 on the CPU: identical arrays (tolerance 0), for every frame count.
    z = _z(t, batch=2)
    frames, finite = wan_tiny.decode_frames_jax(z)
    chunks = list(wan_tiny.decode_stream(z))
    assert [c.frames for c in chunks] == [1] + [4] * (t - 1)
    assert [c.start for c in chunks] == [0] + [1 + 4 * i for i in range(t - 1)]
    np.testing.assert_array_equal(np.concatenate([c.data for c in chunks], axis=1), np.asarray(frames))
    assert all(c.finite.all() for c in chunks) and bool(np.asarray(finite).all())
    video = np.concatenate([c.data for c in wan_tiny.decode_stream(z, output="video", in_flight=1)], axis=2)
    np.testing.assert_array_equal(video, np.asarray(wan_tiny.decode_jax(z)))


def test_a_one_batch_stream_compiles_no_cache_as_the_whole_decode_computes_none(wan_tiny):
    # A live cache changes XLA:CPU's fusions before it: 1 ulp off the whole decode on some CPUs.
    from cogvideox_torchax.vae import stream

    one, none = stream.executables(wan_tiny.programs, (2, 16, 1, 3, 5), "video")
    first, step = stream.executables(wan_tiny.programs, (2, 16, 2, 3, 5), "video")
    assert none is None and one.out_info[1] is None
    assert step is not None and len(jax.tree.leaves(first.out_info[1])) > 0


def test_wan22_stream_unpatchifies_each_chunk(wan22_tiny):
    z = _z(3, channels=4, size=(2, 2))
    chunks = list(wan22_tiny.decode_stream(z, output="video"))
    assert [c.data.shape for c in chunks] == [(1, 3, 1, 32, 32), (1, 3, 4, 32, 32), (1, 3, 4, 32, 32)]
    joined = np.concatenate([c.data for c in chunks], axis=2)
    np.testing.assert_array_equal(joined, np.asarray(wan22_tiny.decode_jax(z)))


def test_wan_stream_memory_and_programs_do_not_grow(wan_tiny):
    short, long = wan_tiny.stream_plan((1, 16, 10, 3, 5)), wan_tiny.stream_plan((1, 16, 1000, 3, 5))
    assert short.name == "streamed" and short.bytes == long.bytes > 0
    peak = {}
    for t in (10, 200):
        top = 0
        for _ in wan_tiny.decode_stream(_z(t)):
            top = max(top, sum(a.nbytes for a in jax.live_arrays()))
        peak[t] = top
    # Weights, the caches and at most in_flight chunks of 4 frames (4 x 24 x 40 x 3 bytes each).
    assert peak[200] <= peak[10] + 4 * 24 * 40 * 3, peak


def test_without_the_frame_scan_the_stream_says_why(wan_tiny_upstream):
    off = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(wan_frame_scan=False))
    with pytest.raises(ValueError, match="streaming needs wan_frame_scan"):
        off.decode_stream(_z(3))
