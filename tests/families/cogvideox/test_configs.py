"""CogVideoX configs around the edges of what upstream's constructor takes: run as upstream runs them, or refused alike.

Block counts from one to four, widths, latent channels, layers per block,
norm groups, quantizing convolutions on and off, and temporal compression
ratios (upstream compresses time at its first int(log2(ratio)) resamplers,
whatever the ratio: 1, 2, 3, 4 and 8 here): each decodes and encodes within
1e-4 of upstream in fp32, or fails where upstream fails, with its error
type. Tiny sizes on the CPU.
"""

import random

import pytest
import torch
from diffusers import AutoencoderKLCogVideoX

import cogvideox_torchax as ct
from tests.support.upstream_outcomes import assert_codes_as_upstream


def _drawn(seed: int) -> dict:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 4])
    return dict(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * n,
        up_block_types=("CogVideoXUpBlock3D",) * n, block_out_channels=tuple(rng.choice([8, 16]) for _ in range(n)),
        latent_channels=rng.choice([2, 4]), layers_per_block=rng.choice([1, 2]), norm_num_groups=rng.choice([1, 2, 4]),
        temporal_compression_ratio=rng.choice([1, 2, 3, 4, 8]), use_quant_conv=rng.choice([False, True]),
        use_post_quant_conv=rng.choice([False, True]),
    )


@pytest.mark.parametrize("seed", range(12))
def test_a_config_upstream_builds_runs_as_upstream_runs_it_or_fails_where_it_fails(seed):
    config = _drawn(seed)
    torch.manual_seed(0)
    upstream = AutoencoderKLCogVideoX(**config).eval()
    ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn(1, config["latent_channels"], 3, 3, 3, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert_codes_as_upstream(upstream, ours, z, x, f"drawn-{seed}")
