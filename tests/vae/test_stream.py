"""`TorchaxVAE.decode_stream`'s refusals, named when it is called (tiny config).

Each family's stream against its whole decode: tests/families/<name>/test_stream.py.
"""

import numpy as np
import pytest

import cogvideox_torchax as ct


@pytest.fixture(scope="module")
def tiny(tiny_upstream):
    return ct.wrap(tiny_upstream, mesh="dp=1,tp=1")


def _z(t, batch=2, seed=0, size=(8, 8)):
    return np.random.default_rng(seed + t).standard_normal((batch, 4, t, *size)).astype(np.float32)


def test_tiled_decodes_and_bad_arguments_are_refused_with_the_reason(tiny_upstream, tiny):
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32)
    with pytest.raises(ValueError, match="tiled decodes do not stream"):
        vae.decode_stream(_z(3, size=(16, 16)))  # refused when called, before any decode
    with pytest.raises(ValueError, match="tiled decodes do not stream"):
        vae.stream_plan((1, 4, 3, 16, 16))
    with pytest.raises(ValueError, match="output must be one of"):
        tiny.decode_stream(_z(3), output="png")
    with pytest.raises(ValueError, match="in_flight must be an int >= 1"):
        tiny.decode_stream(_z(3), in_flight=0)
    with pytest.raises(ValueError):
        tiny.decode_stream(np.zeros((1, 5, 3, 8, 8), np.float32))  # 5 channels, the model has 4
