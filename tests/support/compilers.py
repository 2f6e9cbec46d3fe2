"""Tests that compile for a GPU or TPU: skipped without that compiler, failed under CI."""

import os

import pytest

from cogvideox_torchax.platforms import accelerators


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
