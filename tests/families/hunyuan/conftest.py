"""HunyuanVideo 1.0 and 1.5 fixtures: diffusers' tiny test configs, seeded random weights, norms off their init."""

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import psnr
from tests.support.reference import seeded_latents, upstream_decode


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


def pooled_bf16_psnr(build, shape: tuple[int, ...], label: str, seeds: int = 4) -> tuple[float, float]:
    """(ours, upstream's) bf16 decode PSNR against upstream's fp32, pooled over ``seeds`` models ``build(seed)``.

    Pooled: at the tiny widths one model's bf16 PSNR swings about 1.5 dB with
    where single roundings fall, for upstream's bf16 and ours alike.
    """
    reference, theirs, ours = [], [], []
    for seed in range(seeds):
        upstream = build(seed)
        z = seeded_latents(shape, seed)
        reference.append(upstream_decode(upstream, z))
        theirs.append(upstream_decode(upstream.to(torch.bfloat16), z.to(torch.bfloat16)).float())
        upstream.to(torch.float32)
        decoded = ct.wrap(upstream, dtype="bfloat16", mesh="dp=1,tp=1").decode(z).sample
        assert decoded.dtype == torch.bfloat16 and torch.isfinite(decoded).all()
        ours.append(decoded.float())
    reference, theirs, ours = (torch.cat(x) for x in (reference, theirs, ours))
    ours_db, theirs_db = psnr(ours, reference), psnr(theirs, reference)
    print(f"[psnr] {label} bf16, {seeds} seeds: ours {ours_db:.2f} dB, upstream torch {theirs_db:.2f} dB vs fp32")
    return ours_db, theirs_db
