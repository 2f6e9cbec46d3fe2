"""Runs tests/multidevice in its own pytest process on 8 simulated devices.

The device count is fixed when JAX starts, so it cannot be changed inside
this process; the child's report is printed here. The default tier runs as
two children, CogVideoX's meshes and the other families', so that the
suite's two workers can run them side by side instead of one worker
spending three minutes on all of it.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from tests.support.cpu_codegen import with_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]


GROUPS = {
    "cogvideox": ("tests/multidevice/test_sharding.py", "tests/multidevice/test_stream.py",
                  "tests/multidevice/test_planner_tp.py"),
    "other-families": ("tests/multidevice/test_wan_sharding.py", "tests/multidevice/test_ltx2_sharding.py",
                       "tests/multidevice/test_hunyuan_sharding.py"),
}


def test_the_groups_hold_every_multidevice_file():
    files = {f"tests/multidevice/{p.name}" for p in (ROOT / "tests" / "multidevice").glob("test_*.py")}
    assert files == {f for group in GROUPS.values() for f in group}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_multidevice_suite(group):
    _run_child("not heavy", GROUPS[group])


@pytest.mark.heavy
def test_multidevice_heavy_suite():
    _run_child("heavy", ("tests/multidevice",))


def _run_child(marks: str, paths: tuple[str, ...]) -> None:
    env = dict(os.environ, XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=8"), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-n", "0", "-m", marks,
         *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(proc.stdout[-20000:], proc.stderr[-5000:])
    assert proc.returncode == 0, f"multidevice suite failed (exit {proc.returncode}); its output is above"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
