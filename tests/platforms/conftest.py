"""Fixtures of the compile-for-another-platform tests."""

import pytest

import cogvideox_torchax as ct


@pytest.fixture(scope="session")
def vae_15():
    """The real CogVideoX 1.5 VAE architecture, seeded random weights, bf16 (for lowering and compiling only)."""
    return ct.wrap(ct.random_upstream("cogvideox-1.5", seed=0), dtype="bfloat16", mesh="dp=1,tp=1")
