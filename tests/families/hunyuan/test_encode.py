"""HunyuanVideo's encode against upstream's posterior (eager PyTorch, CPU): one encoder call up to 16 frames,
blended frame windows past them, spatial tiles."""

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close


def _video(shape, seed=0):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# One frame alone, 4k+1 frames (9), a count that is not (10), past one window (21: two windows, 33: three);
# odd sizes; a batch of two.
@pytest.mark.parametrize("shape", [(1, 3, 1, 16, 24), (1, 3, 9, 24, 16), (1, 3, 10, 8, 8), (1, 3, 21, 8, 16),
                                   (1, 3, 33, 8, 8), (2, 3, 9, 8, 16)])
def test_posterior_is_upstreams(hunyuan_tiny_upstream, hunyuan_tiny, shape):
    x = _video(shape, seed=shape[2])
    with torch.no_grad():
        expected = hunyuan_tiny_upstream.encode(x).latent_dist
    got = hunyuan_tiny.encode(x).latent_dist
    assert got.mean.shape == expected.mean.shape
    # fp32: the largest seen here is 1e-6.
    assert_close(got.mean, expected.mean, atol=1e-5, label=f"hunyuan-tiny mean {shape}")
    assert_close(got.logvar, expected.logvar, atol=1e-5, label=f"hunyuan-tiny logvar {shape}")


def test_tiled_encode_within_windows_is_upstreams(hunyuan_tiny_upstream):
    tiling = {"tile_sample_min_height": 16, "tile_sample_min_width": 16,
              "tile_sample_stride_height": 8, "tile_sample_stride_width": 8}
    x = _video((1, 3, 21, 16, 24), seed=3)
    hunyuan_tiny_upstream.enable_tiling(**tiling)
    try:
        with torch.no_grad():
            expected = hunyuan_tiny_upstream.encode(x).latent_dist.mean
    finally:
        hunyuan_tiny_upstream.disable_tiling()
    vae = ct.wrap(hunyuan_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
    vae.enable_tiling(**tiling)
    assert_close(vae.encode(x).latent_dist.mean, expected, atol=1e-5, label="hunyuan-tiny tiled encode")


def test_bad_video_names_the_channels(hunyuan_tiny):
    with pytest.raises(ValueError, match="3 channels"):
        hunyuan_tiny.encode(torch.zeros(1, 4, 1, 16, 16))
