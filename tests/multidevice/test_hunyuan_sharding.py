"""HunyuanVideo 1.0 and 1.5 on meshes of 8 simulated CPU devices: one device's result (tests/test_multidevice.py)."""

import jax
import numpy as np
import pytest

import cogvideox_torchax as ct
from tests.families.hunyuan.conftest import perturbed, perturbed_rms
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")


@pytest.fixture(scope="module")
def hunyuan_upstream():
    return perturbed(ct.random_upstream("hunyuanvideo-tiny", seed=0))


@pytest.mark.parametrize(
    "mesh,shape",
    [
        ("dp=1,tp=8", (1, 4, 6, 2, 5)),  # two windows; latent width 5 does not divide by 8
        ("dp=2,tp=4", (2, 4, 12, 3, 6)),  # 6 does not divide by 4; three full windows, two per scan step (padded)
        ("dp=8,tp=1", (8, 4, 2, 2, 3)),  # batch 8 over dp, no windows
    ],
)
def test_hunyuan_mesh_matches_single_device(hunyuan_upstream, mesh, shape):
    z = seeded_latents(shape)
    single = ct.wrap(hunyuan_upstream, mesh="dp=1,tp=1").decode(z).sample.numpy()
    vae = ct.wrap(hunyuan_upstream, mesh=mesh)
    assert "shard_activations" in vae.plan.steps
    out = vae.decode_jax(z)
    assert len(out.sharding.device_set) == vae.mesh.shape["dp"] * vae.mesh.shape["tp"]
    # fp32 tolerance: the single device's own distance to upstream is ~1e-5 (outputs to ~10); 1.2e-5 seen here.
    assert_close(np.asarray(out), single, atol=3e-5, label=f"hunyuan {mesh} {shape}")


def test_hunyuan_encode_on_a_mesh_matches_single_device(hunyuan_upstream):
    import torch

    # 41 frames: windows of 17 frames at 0, 12 and 24 (two per scan step, padded) and a short one at 36.
    x = torch.rand((2, 3, 41, 16, 24), generator=torch.Generator().manual_seed(1)) * 2 - 1
    single = ct.wrap(hunyuan_upstream, mesh="dp=1,tp=1").encode(x).latent_dist.mean.numpy()
    got = ct.wrap(hunyuan_upstream, mesh="dp=2,tp=4").encode(x).latent_dist.mean.numpy()
    assert_close(got, single, atol=1e-5, label="hunyuan encode dp=2,tp=4")


@pytest.mark.parametrize("mesh,shape", [("dp=1,tp=8", (1, 4, 5, 3, 5)), ("dp=2,tp=4", (1, 4, 3, 2, 6))])
def test_hunyuan15_mesh_matches_single_device(mesh, shape):
    # One video (upstream's attention takes one at a time): the whole video's attention over every device.
    upstream = perturbed_rms(ct.random_upstream("hunyuanvideo15-tiny", seed=0))
    z = seeded_latents(shape)
    single = ct.wrap(upstream, mesh="dp=1,tp=1").decode(z).sample.numpy()
    out = ct.wrap(upstream, mesh=mesh).decode_jax(z)
    assert_close(np.asarray(out), single, atol=1e-5, label=f"hunyuan15 {mesh} {shape}")


def test_hunyuan_tiles_on_a_mesh_match_single_device(hunyuan_upstream):
    # 3x3 tiles of four shapes; at dp=2 two tiles per scan step.
    tiling = {"tile_sample_min_height": 24, "tile_sample_min_width": 32,
              "tile_sample_stride_height": 16, "tile_sample_stride_width": 24}
    z = seeded_latents((1, 4, 2, 6, 9))
    outs = []
    for mesh in ("dp=1,tp=1", "dp=2,tp=4"):
        vae = ct.wrap(hunyuan_upstream, mesh=mesh)
        vae.enable_tiling(**tiling)
        assert "hunyuan_tile_batching" in vae.plan.steps
        outs.append(np.asarray(vae.decode_jax(z)))
    assert_close(outs[1], outs[0], atol=3e-5, label="hunyuan tiles dp=2,tp=4")
