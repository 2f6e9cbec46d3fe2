"""Wan's tiled decode: upstream's tiles and blending, each tile's frames one scan; and the planner's Wan tilings."""

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents

# Tiles of 4x6 latents stepping by 3x4 over a 9x13 latent frame: interior,
# edge and corner tiles of four shapes.
TILING = {"tile_sample_min_height": 32, "tile_sample_min_width": 48,
          "tile_sample_stride_height": 24, "tile_sample_stride_width": 32}


def _upstream_tiled(upstream, z, tiling):
    upstream.enable_tiling(**tiling)
    try:
        with torch.no_grad():
            return upstream.decode(z).sample
    finally:
        upstream.disable_tiling()


def test_wan_tiled_decode_is_upstreams(wan_tiny_upstream):
    z = seeded_latents((1, 16, 3, 9, 13))
    expected = _upstream_tiled(wan_tiny_upstream, z, TILING)
    vae = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1")
    vae.enable_tiling(**TILING)
    assert "wan_tile_batching" in vae.plan.steps
    # fp32: the largest seen here is 9e-7.
    assert_close(vae.decode(z).sample, expected, atol=1e-5, label="wan-tiny tiled")


def test_wan22_tiled_decode_unpatchifies_after_blending(wan22_tiny_upstream):
    tiling = {"tile_sample_min_height": 64, "tile_sample_min_width": 64,
              "tile_sample_stride_height": 48, "tile_sample_stride_width": 48}
    z = seeded_latents((1, 4, 2, 5, 7))
    expected = _upstream_tiled(wan22_tiny_upstream, z, tiling)
    vae = ct.wrap(wan22_tiny_upstream, mesh="dp=1,tp=1")
    vae.enable_tiling(**tiling)
    assert_close(vae.decode(z).sample, expected, atol=1e-5, label="wan2.2-tiny tiled")


def test_the_planner_tiles_a_wan_decode_that_does_not_fit_whole(wan_tiny_upstream):
    shape = (1, 16, 2, 16, 16)
    # The planner's own candidates, compiled as it goes (every candidate, `memory_candidates`, is
    # LTX-2's test: here the smallest tiles alone would be a 10 s compile more).
    whole = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1").memory_plan(shape)  # the host's memory: all fits
    assert whole.name == "whole" and whole.tiling is None
    # A budget only the tiled plans fit (the planner keeps a 10 % margin).
    vae = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1", max_memory=int((whole.bytes - 1) / 0.9) - 1)
    plan = vae.memory_plan(shape)
    assert plan.tiling is not None and plan.bytes < whole.bytes
    z = seeded_latents(shape)
    expected = _upstream_tiled(wan_tiny_upstream, z, plan.tiling)
    got = vae.decode(z).sample
    assert got.shape == (1, 3, 5, 128, 128)  # the whole video's size, whatever the tiles
    assert_close(got, expected, atol=1e-5, label=f"planned {plan.name}")
    with pytest.raises(ct.MemoryBudgetError, match="no plan for the decode"):
        # A quarter of the tiled plan's bytes: the planner measures smaller tiles only while they need less.
        ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1", max_memory=plan.bytes // 4).memory_plan(shape)
