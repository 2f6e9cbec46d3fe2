"""CogVideoX's `decode_stream`: one latent frame batch at a time equals the whole decode, in flat memory."""

import jax
import numpy as np
import pytest

import cogvideox_torchax as ct


@pytest.fixture(scope="module")
def tiny(tiny_upstream):
    return ct.wrap(tiny_upstream, mesh="dp=1,tp=1")


def _z(t, batch=2, seed=0, size=(8, 8)):
    return np.random.default_rng(seed + t).standard_normal((batch, 4, t, *size)).astype(np.float32)


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 8])
def test_streamed_frames_and_video_equal_the_whole_decode_exactly(tiny, t):
    # fp32 on the CPU: identical arrays (tolerance 0), for every frame count.
    z = _z(t)
    frames, finite = tiny.decode_frames_jax(z)
    chunks = list(tiny.decode_stream(z))
    np.testing.assert_array_equal(np.concatenate([c.data for c in chunks], axis=1), np.asarray(frames))
    assert all(c.finite.all() for c in chunks) and bool(np.asarray(finite).all())
    # Each chunk says where it starts and how many frames it holds.
    assert [c.start for c in chunks] == list(np.cumsum([0] + [c.frames for c in chunks[:-1]]))
    assert sum(c.frames for c in chunks) == frames.shape[1] and len(chunks) == max(t // 2, 1)
    video = np.concatenate([c.data for c in tiny.decode_stream(z, output="video", in_flight=1)], axis=2)
    np.testing.assert_array_equal(video, np.asarray(tiny.decode_jax(z)))


def test_streamed_bf16_equals_the_whole_bf16_decode(tiny_upstream):
    vae = ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1")
    z = _z(6)
    got = np.concatenate([c.data for c in vae.decode_stream(z)], axis=1)
    np.testing.assert_array_equal(got, np.asarray(vae.decode_frames_jax(z)[0]))  # tolerance 0


def test_two_programs_serve_every_length_and_their_bytes_do_not_grow(tiny):
    executables = tiny.programs.own.executables
    short = tiny.stream_plan((1, 4, 10, 8, 8))
    before = set(executables)
    long = tiny.stream_plan((1, 4, 1000, 8, 8))
    assert short.name == "streamed" and short.bytes == long.bytes > 0
    assert set(executables) == before  # 1,000 latent frames compile nothing more than 10
    assert {k[0] for k in before if k[0].startswith("stream_") and k[1][0] == 1} >= {
        "stream_first_frames", "stream_step_frames"}
    # The whole decode's program grows with the video.
    assert tiny.memory_plan((1, 4, 40, 8, 8)).bytes > tiny.memory_plan((1, 4, 10, 8, 8)).bytes


def _peak_live_bytes(vae, z, in_flight=2):
    peak, frames = 0, 0
    for chunk in vae.decode_stream(z, in_flight=in_flight):
        frames += chunk.frames
        peak = max(peak, sum(a.nbytes for a in jax.live_arrays()))
    return peak, frames


def test_live_device_memory_is_the_same_at_10_and_1000_latent_frames(tiny):
    short, _ = _peak_live_bytes(tiny, _z(10, batch=1))
    long, frames = _peak_live_bytes(tiny, _z(1000, batch=1))
    assert frames == 4000
    # Weights, the conv cache and at most in_flight batches: the same whatever the length
    # (one batch of frames is 8 x 64 x 64 x 3 bytes; the whole video would be 500 of them).
    assert long <= short + 8 * 64 * 64 * 3, (short, long)
