"""The wrapped AutoencoderKLWan against what diffusers' own model tests ask of the upstream one.

diffusers' tests (tests/models/autoencoders/test_models_autoencoder_wan.py in
its repository) are not in its distributions (the sdist holds only
tests/testing_utils.py), and this project copies no code, so their checks
are restated here on their config (our ``wan-tiny`` preset) and inputs (2
videos of 9 frames at 16x16, seed 0), against upstream eager rather than
against tolerances of 0.5. docs/pipelines.md lists each of their test
classes and what answers it here.
"""

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close


@pytest.fixture(scope="module")
def pair():
    upstream = ct.random_upstream("wan-tiny", seed=0)
    return upstream, ct.wrap(upstream, mesh="dp=1,tp=1")


def _sample():
    return torch.randn((2, 3, 9, 16, 16), generator=torch.Generator().manual_seed(0))


def test_forward_output_shape_and_values(pair):
    upstream, ours = pair
    with torch.no_grad():
        expected = upstream(_sample()).sample
    got = ours(_sample()).sample
    assert got.shape == (2, 3, 9, 16, 16)  # their output_shape, per video
    assert_close(got, expected, atol=1e-5, label="forward, posterior mode")
    # Deterministic: the same call twice gives the same bits.
    assert torch.equal(ours(_sample()).sample, got)


def test_forward_sampling_the_posterior_with_a_generator(pair):
    upstream, ours = pair
    with torch.no_grad():
        expected = upstream(_sample(), sample_posterior=True, generator=torch.Generator().manual_seed(1)).sample
    got = ours(_sample(), sample_posterior=True, generator=torch.Generator().manual_seed(1)).sample
    assert_close(got, expected, atol=1e-5, label="forward, posterior sampled")
    (tuple_out,) = ours(_sample(), return_dict=False)
    assert torch.equal(tuple_out, ours(_sample()).sample)


def test_enable_disable_tiling_and_slicing(pair):
    upstream, _ = pair
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    # Their defaults (256-pixel tiles) do not tile 16x16; 16-pixel tiles stepping by 8 tile 32x32, as upstream's.
    sample = torch.randn((2, 3, 1, 32, 32), generator=torch.Generator().manual_seed(0))
    tiling = {"tile_sample_min_height": 16, "tile_sample_min_width": 16,
              "tile_sample_stride_height": 8, "tile_sample_stride_width": 8}
    plain = vae(sample).sample
    vae.enable_tiling(**tiling)
    upstream.enable_tiling(**tiling)
    try:
        with torch.no_grad():
            expected = upstream(sample).sample
    finally:
        upstream.disable_tiling()
    assert_close(vae(sample).sample, expected, atol=1e-5, label="tiled forward")
    vae.disable_tiling()
    assert torch.equal(vae(sample).sample, plain)
    vae.enable_slicing()
    assert_close(vae(sample).sample, plain, atol=1e-6, label="sliced forward")
    vae.disable_slicing()
    assert torch.equal(vae(sample).sample, plain)


def test_training_and_memory_features_are_refused_by_name(pair):
    _, ours = pair
    for name in ("enable_gradient_checkpointing", "enable_layerwise_casting", "enable_group_offload", "parameters"):
        with pytest.raises(ct.UnsupportedAttributeError, match=name):
            getattr(ours, name)
