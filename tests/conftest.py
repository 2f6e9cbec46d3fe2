"""Fixtures shared across folders: the tiny and real-size upstream VAEs, wrapped ones, cached 2b references."""

import os

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.reference import seeded_latents, upstream_decode

# tests/multidevice needs 8 simulated devices, which must be set before JAX
# starts; tests/test_multidevice.py runs it in its own process with them.
collect_ignore = [] if "device_count=8" in os.environ.get("XLA_FLAGS", "") else ["multidevice"]


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
