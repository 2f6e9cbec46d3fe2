"""Wan on meshes of 8 simulated CPU devices gives the single-device result (run by tests/test_multidevice.py)."""

import jax
import numpy as np
import pytest
import torch

import cogvideox_torchax as ct
from tests.families.wan.conftest import perturbed
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")


@pytest.fixture(scope="module")
def wan_upstream():
    return perturbed(ct.random_upstream("wan-tiny", seed=0))


@pytest.fixture(scope="module")
def wan_single(wan_upstream):
    return ct.wrap(wan_upstream, mesh="dp=1,tp=1")


@pytest.mark.parametrize(
    "mesh,shape",
    [
        ("dp=1,tp=8", (1, 16, 3, 2, 5)),  # latent width 5 does not divide by 8
        ("dp=2,tp=4", (2, 16, 2, 3, 6)),  # 6 does not divide by 4
        ("dp=8,tp=1", (8, 16, 2, 2, 3)),  # batch 8 over dp
    ],
)
def test_wan_mesh_matches_single_device(wan_upstream, wan_single, mesh, shape):
    z = seeded_latents(shape)
    vae = ct.wrap(wan_upstream, mesh=mesh)
    assert "shard_activations" in vae.plan.steps
    out = vae.decode_jax(z)
    dp, tp = vae.mesh.shape["dp"], vae.mesh.shape["tp"]
    assert len(out.sharding.device_set) == dp * tp  # laid out over the mesh, not replicated
    # fp32 tolerance: the single device's own distance to upstream is ~5e-7.
    assert_close(np.asarray(out), wan_single.decode(z).sample.numpy(), atol=1e-5, label=f"wan {mesh} {shape}")


def test_wan_tail_chunks_on_a_mesh_match_single_device(wan_upstream, wan_single):
    # What a TPU mesh with tp > 1 runs by default: the decoder's tail two frames at a time.
    z = seeded_latents((1, 16, 3, 2, 5))
    vae = ct.wrap(wan_upstream, mesh="dp=1,tp=8", options=ct.RuntimeOptions(wan_tail_chunks=True))
    assert {"shard_activations", "wan_tail_chunks"} <= set(vae.plan.steps)
    assert_close(np.asarray(vae.decode_jax(z)), wan_single.decode(z).sample.numpy(), atol=1e-5,
                 label="wan tail chunks dp=1,tp=8")


def test_wan_encode_on_a_mesh(wan_upstream, wan_single):
    x = torch.rand(2, 3, 5, 16, 24, generator=torch.Generator().manual_seed(0)) * 2 - 1
    vae = ct.wrap(wan_upstream, mesh="dp=2,tp=4")
    assert_close(vae.encode(x).latent_dist.mean, wan_single.encode(x).latent_dist.mean, atol=1e-5,
                 label="wan encode dp=2,tp=4")


def test_wan_activations_are_constrained_in_the_program(wan_upstream):
    vae = ct.wrap(wan_upstream, mesh="dp=2,tp=4")
    text = vae.lower_decode((2, 16, 2, 3, 5)).as_text()
    constraints = [ln for ln in text.splitlines() if "sharding_constraint" in ln]
    assert len(constraints) > 20
    five_d = [ln for ln in constraints if "tensor<2x" in ln and ln.count("x") >= 5 and "[{" in ln]
    assert five_d and all('[{"dp"}, {}, {}, {}, {"tp"}]' in ln for ln in five_d), five_d[:3]
