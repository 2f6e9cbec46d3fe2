"""LTX-2 and LTX-Video on meshes of 8 simulated CPU devices: one device's result (run by tests/test_multidevice.py)."""

import jax
import numpy as np
import pytest

import cogvideox_torchax as ct
from tests.families.ltx2.conftest import perturbed
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")


@pytest.fixture(scope="module")
def ltx2_upstream():
    return perturbed(ct.random_upstream("ltx2-tiny", seed=0))


@pytest.mark.parametrize(
    "mesh,shape",
    [
        ("dp=1,tp=8", (1, 8, 3, 2, 5)),  # latent width 5 does not divide by 8; reflection padding at the seams
        ("dp=2,tp=4", (2, 8, 2, 3, 6)),  # 6 does not divide by 4
        ("dp=8,tp=1", (8, 8, 2, 2, 3)),  # batch 8 over dp
    ],
)
def test_ltx2_mesh_matches_single_device(ltx2_upstream, mesh, shape):
    z = seeded_latents(shape)
    single = ct.wrap(ltx2_upstream, mesh="dp=1,tp=1").decode(z).sample.numpy()
    vae = ct.wrap(ltx2_upstream, mesh=mesh)
    assert "shard_activations" in vae.plan.steps
    out = vae.decode_jax(z)
    dp, tp = vae.mesh.shape["dp"], vae.mesh.shape["tp"]
    assert len(out.sharding.device_set) == dp * tp  # laid out over the mesh, not replicated
    # fp32 tolerance: the single device's own distance to upstream is ~2e-6.
    assert_close(np.asarray(out), single, atol=1e-5, label=f"ltx2 {mesh} {shape}")


@pytest.mark.parametrize(
    "mesh,shape",
    [
        ("dp=1,tp=8", (1, 8, 3, 2, 5)),  # latent width 5 does not divide by 8
        ("dp=2,tp=4", (2, 8, 2, 3, 6)),  # the noise draws, one per feature map, whole on every device
    ],
)
def test_ltx_video_with_noise_mesh_matches_single_device(mesh, shape):
    # LTX-Video 0.9.1's tiny config: a timestep and injected noise, from the same generator state on each mesh.
    import torch

    upstream = perturbed(ct.random_upstream("ltx-tiny", seed=0))
    z, temb = seeded_latents(shape), torch.linspace(0.05, 0.2, shape[0])
    torch.manual_seed(5)
    single = ct.wrap(upstream, mesh="dp=1,tp=1").decode(z, temb).sample.numpy()
    vae = ct.wrap(upstream, mesh=mesh)
    torch.manual_seed(5)
    out = vae.decode_jax(z, temb=temb)
    assert len(out.sharding.device_set) == vae.mesh.shape["dp"] * vae.mesh.shape["tp"]
    assert_close(np.asarray(out), single, atol=1e-5, label=f"ltx-video {mesh} {shape}")
