"""HunyuanVideo 1.0 and 1.5 fixtures: diffusers' tiny test configs, seeded random weights, norms off their init."""

import pytest
import torch

import cogvideox_torchax as ct


def perturbed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` with every group norm's gain and bias moved off their init (a misplaced one must show)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.GroupNorm) and m.affine:
                m.weight.mul_(1 + 0.5 * (2 * torch.rand(m.weight.shape, generator=generator) - 1))
                m.bias.add_(0.2 * (2 * torch.rand(m.bias.shape, generator=generator) - 1))
    return module


def upstream_of(config: dict, seed: int = 0) -> torch.nn.Module:
    """An upstream `AutoencoderKLHunyuanVideo` of ``config``: seeded random weights, norms perturbed."""
    from diffusers import AutoencoderKLHunyuanVideo

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return perturbed(AutoencoderKLHunyuanVideo.from_config(config).eval(), seed)


@pytest.fixture(scope="session")
def hunyuan_tiny_upstream():
    """The hunyuanvideo-tiny preset (diffusers' own test config), seeded, norms perturbed."""
    return perturbed(ct.random_upstream("hunyuanvideo-tiny", seed=0))


@pytest.fixture(scope="session")
def hunyuan_tiny(hunyuan_tiny_upstream):
    return ct.wrap(hunyuan_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")


def upstream15_of(config: dict, seed: int = 0) -> torch.nn.Module:
    """An upstream `AutoencoderKLHunyuanVideo15` of ``config``: seeded random weights, RMS norm gains perturbed."""
    from diffusers import AutoencoderKLHunyuanVideo15

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return perturbed_rms(AutoencoderKLHunyuanVideo15.from_config(config).eval(), seed)


def perturbed_rms(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` with every RMS norm gain (``gamma``) moved off its init of ones."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("gamma"):
                p.mul_(1 + 0.5 * (2 * torch.rand(p.shape, generator=generator) - 1))
    return module


@pytest.fixture(scope="session")
def hunyuan15_tiny_upstream():
    """The hunyuanvideo15-tiny preset (diffusers' 1.5 pipeline-test VAE), seeded, norms perturbed."""
    return perturbed_rms(ct.random_upstream("hunyuanvideo15-tiny", seed=0))


@pytest.fixture(scope="session")
def hunyuan15_tiny(hunyuan15_tiny_upstream):
    return ct.wrap(hunyuan15_tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
