"""HunyuanVideo 1.0 and 1.5 configs around the edges of what upstream's constructors take: run as upstream runs
them, or refused alike.

1.0: one to four blocks, spatial ratios 4, 8 and 16, the middle attention
off, one or two resnets (its decoder takes only a temporal ratio of 4:
upstream's constructor refuses the others, and so does the check). 1.5: two
to four blocks of mixed widths, spatial ratios 2, 4 and 8, temporal ratios 1,
2 and 4, matched and unmatched sampler widths, and a config whose samplers
upstream's constructor cannot build. Each decodes and encodes within 1e-4
of upstream in fp32, or fails where upstream fails, with its error type.
Tiny sizes on the CPU; latents past one frame window for 1.0.
"""

import random
import warnings

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo, AutoencoderKLHunyuanVideo15

import cogvideox_torchax as ct
from cogvideox_torchax.families import ConfigError
from tests.support.upstream_outcomes import assert_codes_as_upstream


def _drawn(seed: int) -> dict:
    rng = random.Random(seed)
    blocks = rng.choice([1, 2, 3, 4])
    return dict(
        in_channels=3, out_channels=3, latent_channels=rng.choice([2, 4]),
        down_block_types=["HunyuanVideoDownBlock3D"] * blocks, up_block_types=["HunyuanVideoUpBlock3D"] * blocks,
        block_out_channels=[8] * blocks, layers_per_block=rng.choice([1, 2]), norm_num_groups=rng.choice([2, 4]),
        spatial_compression_ratio=rng.choice([4, 8, 16]), temporal_compression_ratio=4,
        mid_block_add_attention=rng.choice([True, False]),
    )


def _drawn15(seed: int) -> dict:
    if seed == 0:
        # Four blocks all resampling space (16x): the last sampler's matched width indexes past the blocks.
        return dict(latent_channels=4, block_out_channels=[8, 8, 16, 16], layers_per_block=1,
                    spatial_compression_ratio=16, temporal_compression_ratio=4)
    rng = random.Random(100 + seed)
    blocks = rng.choice([2, 3, 4])
    return dict(
        in_channels=3, out_channels=3, latent_channels=rng.choice([2, 4]),
        block_out_channels=[rng.choice([8, 16]) for _ in range(blocks)],
        layers_per_block=1, spatial_compression_ratio=rng.choice([2, 4, 8]),
        temporal_compression_ratio=rng.choice([1, 2, 4]), downsample_match_channel=rng.choice([True, False]),
        upsample_match_channel=rng.choice([True, False]),
    )


def _run(upstream, latent_channels, label, frames=6):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ratios that disagree with the architecture: upstream's quirk, warned
        ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn(1, latent_channels, frames, 2, 3, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert_codes_as_upstream(upstream, ours, z, x, label)


@pytest.mark.parametrize("seed", range(5))
def test_a_hunyuanvideo_config_runs_as_upstream_runs_it(seed):
    config = _drawn(seed)
    torch.manual_seed(0)
    _run(AutoencoderKLHunyuanVideo(**config).eval(), config["latent_channels"], f"hunyuan drawn-{seed}")


@pytest.mark.parametrize("seed", range(5))
def test_a_hunyuanvideo15_config_runs_as_upstream_runs_it_or_fails_where_it_fails(seed):
    config = _drawn15(seed)
    torch.manual_seed(0)
    try:
        upstream = AutoencoderKLHunyuanVideo15(**config).eval()
    except Exception:  # noqa: BLE001  (a config upstream does not build: the check refuses it alike)
        from cogvideox_torchax.families.hunyuan import hunyuan15_config_check

        with pytest.raises(ConfigError, match="does not build from it"):
            hunyuan15_config_check.check_config(config)
        return
    assert seed != 0, "seed 0's config is one upstream's constructor refuses"
    _run(upstream, config["latent_channels"], f"hunyuan15 drawn-{seed}", frames=3)


@pytest.mark.parametrize("ratio", [2, 8])
def test_a_temporal_ratio_upstreams_decoder_refuses_is_refused_naming_upstreams_error(ratio):
    from cogvideox_torchax.config import preset_config
    from cogvideox_torchax.families.hunyuan import config_check

    with pytest.raises(ConfigError, match="upstream's AutoencoderKLHunyuanVideo does not build from it: ValueError"):
        config_check.check_config({**preset_config("hunyuanvideo-tiny"), "temporal_compression_ratio": ratio})
