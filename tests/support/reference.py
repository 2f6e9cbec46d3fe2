"""The references parity tests compare against: seeded latents and upstream's eager torch decode."""

import torch


def upstream_decode(module, z: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module.decode(z).sample


def seeded_latents(shape, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
