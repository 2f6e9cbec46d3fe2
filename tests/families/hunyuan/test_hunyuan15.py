"""HunyuanVideo 1.5 (`AutoencoderKLHunyuanVideo15`) against upstream eager PyTorch on the CPU: its default decode is
the whole video through the decoder at once (every latent token in one frame-causal attention), ours the same
decode without the mask; the planner's spatial tiles; encode; bf16; one program whatever the length."""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.config import preset_config
from tests.families.hunyuan.conftest import pooled_bf16_psnr, upstream15_of
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode

TINY = preset_config("hunyuanvideo15-tiny")
# The release's geometry (16x space, 4x time, five blocks, channels matched at the samplers) at test widths.
RELEASE_NARROW = {**preset_config("hunyuanvideo15"), "latent_channels": 8, "block_out_channels": [8, 16, 16, 32, 32],
                  "layers_per_block": 1}


def test_the_record_and_presets():
    family = families.of_preset("hunyuanvideo15")
    assert family.name == "hunyuan15" and family.class_name == "AutoencoderKLHunyuanVideo15"
    assert (family.spatial_scale(preset_config("hunyuanvideo15")), family.frame_rule(preset_config("hunyuanvideo15"))
            ) == (16, "4k+1")
    assert (family.spatial_scale(TINY), family.frame_rule(TINY)) == (4, "2k+1")
    assert families.of_module(ct.random_upstream("hunyuanvideo15-tiny")) is family
    assert family.untiled_settings == {}  # its default decode is whole already


# One latent frame, two, five (one attention over all of them); odd and non-square sizes.
@pytest.mark.parametrize("shape", [(1, 4, 1, 3, 3), (1, 4, 2, 3, 5), (1, 4, 5, 5, 2)])
def test_decode_is_upstreams_whole_decode(hunyuan15_tiny_upstream, hunyuan15_tiny, shape):
    z = seeded_latents(shape, seed=shape[2])
    expected = upstream_decode(hunyuan15_tiny_upstream, z)
    got = hunyuan15_tiny.decode(z).sample
    assert got.shape == (shape[0], 3, 1 + 2 * (shape[2] - 1), 4 * shape[3], 4 * shape[4])
    # fp32: the largest seen here is 1.3e-6.
    assert_close(got, expected, atol=1e-4, label=f"hunyuan15-tiny fp32 {shape}")


def test_the_release_geometry_decodes_and_encodes_as_upstream():
    upstream = upstream15_of(RELEASE_NARROW, seed=1)
    vae = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1")
    z = seeded_latents((1, 8, 3, 2, 3), seed=2)
    assert_close(vae.decode(z).sample, upstream_decode(upstream, z), atol=1e-4, label="hunyuan15 release geometry")
    x = torch.rand((1, 3, 9, 32, 48), generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        expected = upstream.encode(x).latent_dist.mean
    assert_close(vae.encode(x).latent_dist.mean, expected, atol=1e-5, label="hunyuan15 release geometry encode")


@pytest.mark.parametrize("shape", [(1, 3, 1, 8, 12), (1, 3, 5, 12, 8), (1, 3, 9, 8, 8)])
def test_encode_is_upstreams_posterior(hunyuan15_tiny_upstream, hunyuan15_tiny, shape):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(shape[2])) * 2 - 1
    with torch.no_grad():
        expected = hunyuan15_tiny_upstream.encode(x).latent_dist
    got = hunyuan15_tiny.encode(x).latent_dist
    assert_close(got.mean, expected.mean, atol=1e-5, label=f"hunyuan15-tiny mean {shape}")
    assert_close(got.logvar, expected.logvar, atol=1e-5, label=f"hunyuan15-tiny logvar {shape}")


def test_bf16_psnr_at_least_upstreams_own_bf16():
    # Against upstream's fp32 decode, pooled over four seeded models and latents (`pooled_bf16_psnr`).
    ours_db, theirs_db = pooled_bf16_psnr(lambda seed: upstream15_of(TINY, seed=seed), (1, 4, 4, 3, 3),
                                          "hunyuan15-tiny")
    assert ours_db >= theirs_db - 0.5


def test_a_batch_of_two_fails_as_upstreams_and_slices_as_upstreams(hunyuan15_tiny_upstream):
    # Upstream's attention fails on a batch of two (its (B, N, N) mask does not broadcast against the
    # (B, 1, N, N) scores): refused alike, nothing computed; with slicing, one video at a time, as upstream.
    z = seeded_latents((2, 4, 2, 2, 2), seed=7)
    with pytest.raises(RuntimeError), torch.no_grad():
        hunyuan15_tiny_upstream.decode(z)
    vae = ct.wrap(hunyuan15_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
    with pytest.raises(RuntimeError, match="refuses latents of shape \\(2, 4, 2, 2, 2\\).*as upstream does"):
        vae.decode(z)
    hunyuan15_tiny_upstream.enable_slicing()
    try:
        expected = upstream_decode(hunyuan15_tiny_upstream, z)
    finally:
        hunyuan15_tiny_upstream.disable_slicing()
    vae.enable_slicing()
    assert_close(vae.decode(z).sample, expected, atol=1e-4, label="hunyuan15-tiny batch of two, sliced")


def test_one_program_whatever_the_length(hunyuan15_tiny):
    # The attention's key loop runs as many steps as the frames need at run time: the program does not grow.
    texts = [hunyuan15_tiny.compile_decode((1, 4, t, 2, 2)).as_text() for t in (5, 17)]
    counts = [sum("convolution" in line for line in text.splitlines()) for text in texts]
    assert counts[0] == counts[1] > 0
    assert len(texts[1]) < 1.05 * len(texts[0])


def test_the_planners_tiles_are_upstreams_and_nothing_fitting_is_refused(hunyuan15_tiny_upstream):
    # Each candidate decodes as upstream's tiles, to the whole frame (tiles of a multiple of 4 latents); a budget
    # nothing fits is refused. (At this width the decoded tiles, which upstream keeps for blending, weigh as much
    # as the whole decode's activations: no tiling is smaller here, so the planner's choice is not shown.)
    vae = ct.wrap(hunyuan15_tiny_upstream, mesh="dp=1,tp=1")
    names = [name for name, _ in vae.family.tiled_candidates(vae.module, (16, 12))]
    assert names == ["tiles of 8x8 latents", "tiles of 8x4 latents", "tiles of 4x4 latents"]
    tiling = vae.family.tiled_candidates(vae.module, (6, 7))[-1][1]
    z = seeded_latents((1, 4, 1, 6, 7))
    hunyuan15_tiny_upstream.enable_tiling(**tiling)
    try:
        expected = upstream_decode(hunyuan15_tiny_upstream, z)
    finally:
        hunyuan15_tiny_upstream.disable_tiling()
    vae.enable_tiling(**tiling)
    got = vae.decode(z).sample
    assert got.shape == (1, 3, 1, 24, 28)
    assert_close(got, expected, atol=1e-4, label=f"hunyuan15 {tiling}")
    with pytest.raises(ct.MemoryBudgetError, match="no plan for the decode"):
        ct.wrap(hunyuan15_tiny_upstream, mesh="dp=1,tp=1", max_memory=2**16).memory_plan((1, 4, 1, 4, 4))
