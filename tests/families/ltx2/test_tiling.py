"""LTX-2's tiled decode: upstream's spatial tiles and blending, traced whole; and the planner's LTX-2 tilings."""

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents

# Tiles of 4x5 latents stepping by 3x4 over an 8x10 latent frame (the tiny
# config's 8x compression): interior, edge and corner tiles of four shapes,
# the last row and column 2 latents (reflection pads 1: upstream's own decode
# refuses a tile of 1).
TILING = {"tile_sample_min_height": 32, "tile_sample_min_width": 40,
          "tile_sample_stride_height": 24, "tile_sample_stride_width": 32}


def _upstream_tiled(upstream, z, tiling):
    upstream.enable_tiling(**tiling)
    try:
        with torch.no_grad():
            return upstream.decode(z).sample
    finally:
        upstream.disable_tiling()


def test_ltx2_tiled_decode_is_upstreams(ltx2_tiny_upstream):
    z = seeded_latents((1, 8, 2, 8, 10))
    expected = _upstream_tiled(ltx2_tiny_upstream, z, TILING)
    vae = ct.wrap(ltx2_tiny_upstream, mesh="dp=1,tp=1")
    vae.enable_tiling(**TILING)
    assert vae.family.tiles(vae.module, (8, 10))
    # fp32: upstream's own grid and blending, traced; the largest seen here is 2e-6.
    assert_close(vae.decode(z).sample, expected, atol=1e-4, label="ltx2-tiny tiled")


def test_the_planner_tiles_an_ltx2_decode_that_does_not_fit_whole(ltx2_tiny_upstream):
    shape = (1, 8, 1, 8, 8)
    probe = ct.wrap(ltx2_tiny_upstream, mesh="dp=1,tp=1")
    candidates = probe.memory_candidates(shape)
    whole, tiled = candidates[0], [c for c in candidates if c.tiling]
    assert whole.name == "whole" and tiled and min(c.bytes for c in tiled) < whole.bytes
    smallest = min(tiled, key=lambda c: c.bytes)
    # A budget only the tiled plans fit (the planner keeps a 10 % margin).
    vae = ct.wrap(ltx2_tiny_upstream, mesh="dp=1,tp=1", max_memory=int((whole.bytes - 1) / 0.9) - 1)
    plan = vae.memory_plan(shape)
    assert plan.tiling is not None and plan.bytes < whole.bytes
    z = seeded_latents(shape)
    expected = _upstream_tiled(ltx2_tiny_upstream, z, plan.tiling)
    got = vae.decode(z).sample
    assert got.shape == (1, 3, 1, 64, 64)  # the whole video's size, whatever the tiles
    assert_close(got, expected, atol=1e-4, label=f"planned {plan.name}")
    with pytest.raises(ct.MemoryBudgetError, match="no plan for the decode"):
        ct.wrap(ltx2_tiny_upstream, mesh="dp=1,tp=1", max_memory=smallest.bytes // 4).memory_plan(shape)
