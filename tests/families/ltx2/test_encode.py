"""LTX-2 encode parity with upstream's posterior (eager PyTorch, CPU)."""

import pytest
import torch

from tests.support.parity import assert_close


def _video(shape, seed=0):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# One frame alone, 8k+1 frames (9 and 17), odd sizes; a batch of two.
@pytest.mark.parametrize("shape", [(1, 3, 1, 16, 24), (1, 3, 9, 24, 16), (1, 3, 17, 8, 8), (2, 3, 9, 8, 16)])
def test_ltx2_tiny_posterior(ltx2_tiny_upstream, ltx2_tiny, shape):
    x = _video(shape, seed=shape[2])
    with torch.no_grad():
        expected = ltx2_tiny_upstream.encode(x).latent_dist
    got = ltx2_tiny.encode(x).latent_dist
    assert got.mean.shape == (shape[0], 8, 1 + (shape[2] - 1) // 8, shape[3] // 8, shape[4] // 8)
    # fp32: the largest seen here is 1e-6.
    assert_close(got.mean, expected.mean, atol=1e-5, label=f"ltx2-tiny mean {shape}")
    assert_close(got.logvar, expected.logvar, atol=1e-5, label=f"ltx2-tiny logvar {shape}")


def test_bad_video_names_the_channels(ltx2_tiny):
    with pytest.raises(ValueError, match="3 channels"):
        ltx2_tiny.encode(torch.zeros(1, 4, 1, 16, 16))
