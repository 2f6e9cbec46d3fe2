"""`decode_stream` over dp and tp meshes of 8 simulated devices equals the whole decode exactly.

Run by tests/test_multidevice.py in its own process (8 devices).
"""

import jax
import numpy as np
import pytest

import cogvideox_torchax as ct

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")


@pytest.mark.parametrize("mesh", ["dp=2,tp=1", "dp=1,tp=2", "dp=2,tp=2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streamed_frames_equal_the_whole_decode_on_every_mesh(tiny_upstream, mesh, dtype):
    vae = ct.wrap(tiny_upstream, dtype=dtype, mesh=mesh)
    z = np.random.default_rng(0).standard_normal((2, 4, 5, 8, 16)).astype(np.float32)
    got = np.concatenate([c.data for c in vae.decode_stream(z)], axis=1)
    np.testing.assert_array_equal(got, np.asarray(vae.decode_frames_jax(z)[0]))  # tolerance 0
