"""LTX-2 and LTX-Video fixtures: tiny test configs, seeded random weights, norms, noise and statistics perturbed."""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config

# The tiny config with the decoder's other switches: a causal decoder, and a
# timestep-conditioned one (its time embedders and scale-shift tables).
CAUSAL = {**preset_config("ltx2-tiny"), "decoder_causal": True}
CONDITIONED = {**preset_config("ltx2-tiny"), "timestep_conditioning": True}


def perturbed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` with its norms' affine terms, noise scales and latent statistics off their init (each must show).

    Noise scales start at 0 upstream: noise injection would add nothing.
    """
    generator = torch.Generator().manual_seed(seed)

    def noise(t: torch.Tensor) -> torch.Tensor:
        return 2 * torch.rand(t.shape, generator=generator) - 1

    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if name.endswith(("norm3.weight", "latents_std")):
                t.mul_(1 + 0.5 * noise(t))
            elif name.endswith(("norm3.bias", "latents_mean")):
                t.add_(0.2 * noise(t))
            elif "per_channel_scale" in name:
                t.copy_(0.3 + 0.2 * noise(t))
    return module


def upstream_of(config: dict, seed: int = 0) -> torch.nn.Module:
    """An upstream VAE of ``config`` (its ``_class_name``, else LTX-2's): seeded random weights, perturbed."""
    import diffusers

    cls = getattr(diffusers, config.get("_class_name", "AutoencoderKLLTX2Video"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return perturbed(cls.from_config(config).eval(), seed)


@pytest.fixture(scope="session")
def ltx2_tiny_upstream():
    """The ltx2-tiny preset (diffusers' test config, reflection padding), seeded, perturbed."""
    return perturbed(ct.random_upstream("ltx2-tiny", seed=0))


@pytest.fixture(scope="session")
def ltx2_tiny(ltx2_tiny_upstream):
    return ct.wrap(ltx2_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")


@pytest.fixture(scope="session")
def ltx_video_tiny_upstream():
    """The ltx-tiny preset (diffusers' 0.9.1 test config: conditioned, injecting noise), seeded, perturbed."""
    return perturbed(ct.random_upstream("ltx-tiny", seed=0))


@pytest.fixture(scope="session")
def ltx_video_tiny(ltx_video_tiny_upstream):
    return ct.wrap(ltx_video_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
