"""Wan encode parity with upstream's posterior (eager PyTorch, CPU), and a program that does not grow with length."""

import pytest
import torch

from tests.support.parity import assert_close


def _video(shape, seed=0):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# 1 frame alone, 4k+1 frames (one chunk and three), and 7, whose last two
# frames upstream's encode never reads; odd sizes.
@pytest.mark.parametrize("shape", [(1, 3, 1, 16, 24), (1, 3, 5, 24, 16), (1, 3, 7, 8, 8), (1, 3, 13, 8, 16)])
def test_wan_tiny_posterior(wan_tiny_upstream, wan_tiny, shape):
    x = _video(shape, seed=shape[2])
    with torch.no_grad():
        expected = wan_tiny_upstream.encode(x).latent_dist
    got = wan_tiny.encode(x).latent_dist
    assert got.mean.shape == (1, 16, 1 + (shape[2] - 1) // 4, shape[3] // 8, shape[4] // 8)
    # fp32: the largest seen here is 2e-7.
    assert_close(got.mean, expected.mean, atol=1e-5, label=f"wan-tiny mean {shape}")
    assert_close(got.logvar, expected.logvar, atol=1e-5, label=f"wan-tiny logvar {shape}")


@pytest.mark.parametrize("shape", [(1, 3, 1, 32, 32), (1, 3, 9, 32, 48)])
def test_wan22_tiny_posterior(wan22_tiny_upstream, wan22_tiny, shape):
    """Residual down blocks and 2x2 patches (Wan 2.2 TI2V-5B's paths)."""
    x = _video(shape, seed=shape[2])
    with torch.no_grad():
        expected = wan22_tiny_upstream.encode(x).latent_dist
    got = wan22_tiny.encode(x).latent_dist
    assert_close(got.mean, expected.mean, atol=1e-5, label=f"wan2.2-tiny mean {shape}")
    assert_close(got.logvar, expected.logvar, atol=1e-5, label=f"wan2.2-tiny logvar {shape}")


def test_bad_video_names_the_channels(wan22_tiny):
    # 2x2 patches of 3 colour channels: the model's in_channels are 12, a video has 3.
    with pytest.raises(ValueError, match="3 channels"):
        wan22_tiny.encode(torch.zeros(1, 12, 1, 32, 32))
