"""Tiled decode: upstream's tile grid and blending, equal-shape tiles decoded together."""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.families.cogvideox.patches import tiling
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode

# Tiny config: 8x upsampling, so 32-pixel tiles are 4x4 latents, stepping by 3.
TILES = dict(
    tile_sample_min_height=32, tile_sample_min_width=32, tile_overlap_factor_height=0.25, tile_overlap_factor_width=0.25
)


@pytest.fixture(scope="module")
def tiled_upstream():
    up = ct.random_upstream("tiny", seed=2)
    up.enable_tiling(**TILES)
    return up


def _vae(upstream, **options):
    vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(**options))
    vae.enable_tiling(**TILES)
    return vae


@pytest.mark.parametrize(
    "shape,grid",
    [
        ((1, 4, 2, 4, 4), "1x1: fits one tile, upstream does not tile"),
        ((1, 4, 3, 5, 8), "2x3, bottom row and right column cut short"),
    ],
)
def test_tiled_decode_matches_upstream(tiled_upstream, shape, grid):
    z = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    got = _vae(tiled_upstream).decode(z).sample
    assert_close(got, upstream_decode(tiled_upstream, z), atol=2e-5, label=f"tiled {shape} ({grid})")


def test_tiles_scanned_in_steps_match_upstream(tiled_upstream):
    # 3x3 tiles, four shapes; the four interior-shape tiles go two per scan step.
    z = torch.randn((1, 4, 2, 7, 7), generator=torch.Generator().manual_seed(5))
    vae = _vae(tiled_upstream)
    tiling.apply_tile_batching(vae.module, tiles_per_step=2)
    vae.reset_programs()
    assert_close(vae.decode(z).sample, upstream_decode(tiled_upstream, z), atol=2e-5, label="two tiles per step")


def _lines(vae, shape):
    return len(vae.lower_decode(shape).as_text().splitlines())


def test_program_grows_with_tile_shapes_not_tiles(tiled_upstream):
    batched, per_tile = _vae(tiled_upstream), _vae(tiled_upstream, tile_batching=False)
    small, large = (1, 4, 2, 4, 7), (1, 4, 2, 7, 10)  # 2x3 and 3x4 tiles, four tile shapes each
    counts = {name: (_lines(v, small), _lines(v, large)) for name, v in (("batched", batched), ("per tile", per_tile))}
    print(f"[tiling] lowered lines (6 tiles, 12 tiles): {counts}")
    # Batched: the decoders are per shape; only the blending grows with tiles.
    assert counts["batched"][1] < 1.25 * counts["batched"][0]
    assert counts["per tile"][1] > 1.5 * counts["per tile"][0]


def test_enable_and_disable_tiling_retrace(tiled_upstream):
    vae = _vae(tiled_upstream)
    shape = (1, 4, 2, 5, 5)
    tiled = _lines(vae, shape)
    vae.disable_tiling()
    assert not vae.use_tiling
    assert _lines(vae, shape) < tiled  # one decoder, no tiles


def test_apply_tile_batching_checks_its_arguments():
    with pytest.raises(TypeError, match="AutoencoderKLCogVideoX"):
        tiling.apply_tile_batching(torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="tiles_per_step"):
        tiling.apply_tile_batching(ct.random_upstream("tiny"), tiles_per_step=0)
