"""Runs tests/multidevice in its own pytest process on 8 simulated devices.

The device count is fixed when JAX starts, so it cannot be changed inside
this process; the child's report is printed here.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_multidevice_suite():
    _run_child("not heavy")


@pytest.mark.heavy
def test_multidevice_heavy_suite():
    _run_child("heavy")


def _run_child(marks: str) -> None:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-n", "0", "-m", marks,
         "tests/multidevice"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(proc.stdout[-20000:], proc.stderr[-5000:])
    assert proc.returncode == 0, f"multidevice suite failed (exit {proc.returncode}); its output is above"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
