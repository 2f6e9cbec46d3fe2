"""Wan configs around the edges of what upstream's constructor takes: run as upstream runs them, or refused alike.

One to three levels, temporal downsampling on any of them (upstream's
encode steps four frames at a time whatever the config says), residual
blocks, patch sizes, another decoder width, and scale factors given, left
null or disagreeing with the architecture (upstream's tiling reads them):
each decodes and encodes within 1e-4 of upstream in fp32, or fails where
upstream fails, with its error type. Tiny sizes on the CPU.
"""

import random
import warnings

import pytest
import torch
from diffusers import AutoencoderKLWan

import cogvideox_torchax as ct
from tests.support.upstream_outcomes import assert_codes_as_upstream


def _drawn(seed: int) -> dict:
    rng = random.Random(seed)
    levels, z_dim, patch = rng.choice([1, 2, 3]), rng.choice([4, 16]), rng.choice([None, None, 2])
    config = dict(
        base_dim=rng.choice([3, 4, 8]), z_dim=z_dim, dim_mult=[1] * (levels + 1), num_res_blocks=1,
        temperal_downsample=[rng.choice([True, False]) for _ in range(levels)], is_residual=rng.choice([False, True]),
        attn_scales=[], latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
        in_channels=3 * (patch or 1) ** 2, out_channels=3 * (patch or 1) ** 2, patch_size=patch,
        scale_factor_spatial=rng.choice([None, 4, 8, 16]), scale_factor_temporal=rng.choice([None, 1, 2, 4]),
    )
    if rng.random() < 0.3:
        config["decoder_base_dim"] = rng.choice([4, 8])
    return config


@pytest.mark.parametrize("seed", range(14))
def test_a_config_upstream_builds_runs_as_upstream_runs_it_or_fails_where_it_fails(seed):
    config = _drawn(seed)
    torch.manual_seed(0)
    upstream = AutoencoderKLWan(**config).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scale factors that disagree with the architecture: upstream's quirk, warned
        ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn(1, config["z_dim"], 3, 3, 3, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert_codes_as_upstream(upstream, ours, z, x, f"drawn-{seed}")


def test_scale_factors_that_disagree_with_the_architecture_are_one_warning_each_and_upstreams_attributes():
    config = _drawn(5) | {"scale_factor_spatial": 4}
    upstream = AutoencoderKLWan(**config).eval()
    with pytest.warns(UserWarning, match="scale_factor_spatial is 4 where the architecture compresses"):
        ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    assert ours.spatial_compression_ratio == upstream.spatial_compression_ratio == 4
