import os

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.platforms import accelerators

# tests/multidevice needs 8 simulated devices, which must be set before JAX
# starts; tests/test_multidevice.py runs it in its own process with them.
collect_ignore = [] if "device_count=8" in os.environ.get("XLA_FLAGS", "") else ["multidevice"]


def require_compiler(platform: str) -> None:
    """Skips a test that compiles for ``platform`` ("cuda" / "tpu") where its compiler is not installed.

    Under CI (``CI`` set) the compilers are part of every tested stack, so a
    missing one fails the test instead of hiding it.
    """
    missing = accelerators.compiler_missing(platform)
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI installs the compilers of every stack, yet {missing}")
    if missing:
        pytest.skip(missing)


@pytest.fixture(scope="session")
def tiny_upstream():
    """diffusers' CogVideoX VAE test config with seeded random weights."""
    return ct.random_upstream("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_vae(tiny_upstream):
    return ct.wrap(tiny_upstream, dtype="float32", mesh="dp=1,tp=1")


@pytest.fixture(scope="session")
def upstream_2b():
    """The real CogVideoX-2b VAE architecture with seeded random weights."""
    return ct.random_upstream("cogvideox-2b", seed=0)


@pytest.fixture(scope="session")
def vae_15():
    """The real CogVideoX 1.5 VAE architecture, seeded random weights, bf16 (for lowering and compiling only)."""
    return ct.wrap(ct.random_upstream("cogvideox-1.5", seed=0), dtype="bfloat16", mesh="dp=1,tp=1")


def upstream_decode(module, z: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module.decode(z).sample


def seeded_latents(shape, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="session")
def reference_2b(upstream_2b):
    """``reference_2b(frames) -> (z, upstream fp32 decode)`` for latents (1,16,frames,8,8), seed = frames.

    Cached for the session: ours and the Flax port are both checked against
    the same upstream decodes, which take most of a 2b parity test's time.
    """
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        if frames not in cache:
            z = seeded_latents((1, 16, frames, 8, 8), seed=frames)
            cache[frames] = (z, upstream_decode(upstream_2b, z))
        return cache[frames]

    return get
