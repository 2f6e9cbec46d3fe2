"""Wan fixtures: the tiny test configs with seeded random weights and norms moved off their init, wrapped once."""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config

# Wan 2.2 TI2V-5B's code paths at tiny widths: residual up and down blocks
# (DupUp3D, AvgDown3D), 2x2 patches (12 channels in and out), 16x spatial
# compression, a decoder base width apart from the encoder's.
WAN22_TINY = {
    **preset_config("wan-tiny"),
    "base_dim": 4,
    "decoder_base_dim": 8,
    "z_dim": 4,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "latents_mean": [0.1, -0.2, 0.3, 0.0],
    "latents_std": [1.5, 0.5, 2.0, 1.0],
}


def perturbed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` with every norm gain moved off its init of ones (a wrong gain or its place must show)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("gamma"):
                p.mul_(1 + 0.5 * (2 * torch.rand(p.shape, generator=generator) - 1))
    return module


def upstream_of(config: dict, seed: int = 0) -> torch.nn.Module:
    """An upstream `AutoencoderKLWan` of ``config``, seeded random weights, norms perturbed."""
    from diffusers import AutoencoderKLWan

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return perturbed(AutoencoderKLWan.from_config(config).eval(), seed)


@pytest.fixture(scope="session")
def wan_tiny_upstream():
    """diffusers' own AutoencoderKLWan test config, seeded random weights, norms perturbed."""
    return perturbed(ct.random_upstream("wan-tiny", seed=0))


@pytest.fixture(scope="session")
def wan_tiny(wan_tiny_upstream):
    return ct.wrap(wan_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")


@pytest.fixture(scope="session")
def wan22_tiny_upstream():
    return upstream_of(WAN22_TINY)


@pytest.fixture(scope="session")
def wan22_tiny(wan22_tiny_upstream):
    return ct.wrap(wan22_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
