"""`vae.program`'s frames made on device: the jitted decode's uint8 mapping equals the host's, byte for byte."""

import numpy as np
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.io.video import to_uint8
from tests.support.reference import seeded_latents


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_device_frames_equal_the_host_mapping(tiny_upstream, dtype):
    vae = ct.wrap(tiny_upstream, dtype=dtype, mesh="dp=1,tp=1")
    z = seeded_latents((2, 4, 3, 4, 4), seed=7) * 3  # large enough that some values clip
    frames, finite = vae.decode_frames_jax(z)
    assert frames.dtype == np.uint8 and frames.shape == (2, 9, 32, 32, 3)
    assert finite.shape == (2,) and bool(finite.all())
    expected = to_uint8(np.asarray(vae.decode_jax(z).astype(np.float32)))
    assert np.array_equal(np.asarray(frames), expected)
    assert 0 in expected and 255 in expected  # both clip ends were exercised


def test_device_frames_say_which_decode_was_not_finite(tiny_vae):
    z = torch.zeros((2, 4, 1, 4, 4))
    z[1, 0, 0, 0, 0] = 3e38  # finite, but the decoder overflows on it
    _, finite = tiny_vae.decode_frames_jax(z)
    assert np.asarray(finite).tolist() == [True, False]


def test_device_frames_with_slicing(tiny_upstream):
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    z = seeded_latents((2, 4, 2, 2, 2), seed=3)
    whole, _ = vae.decode_frames_jax(z)
    vae.enable_slicing()
    sliced, finite = vae.decode_frames_jax(z)
    assert np.array_equal(np.asarray(whole), np.asarray(sliced))
    assert finite.shape == (2,) and bool(finite.all())
    assert vae.compiled_shapes("frames")[-1] == (1, 4, 2, 2, 2)
