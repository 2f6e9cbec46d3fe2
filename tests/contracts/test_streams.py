"""A closed or failing stderr changes no outcome: the exit code and the outputs are what they would be."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

DECODE = [sys.executable, "-m", "cogvideox_torchax.decode"]


@pytest.fixture
def z(tmp_path):
    path = tmp_path / "z.safetensors"
    save_file({"latents": torch.zeros(1, 4, 1, 2, 2)}, path)
    return str(path)


def _run(argv, stderr, cwd):
    if stderr == "closed":  # the shell's 2>&-: the process starts without fd 2
        cmd = " ".join(f"'{a}'" for a in argv) + " 2>&-"
        return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=False, stdout=subprocess.PIPE, text=True)
    with open(os.devnull if stderr == "null" else "/dev/full", "w") as err:
        return subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_bad_input_is_exit_2_whatever_stderr_is(tmp_path, z, stderr):
    done = _run([*DECODE, z, "--model", "random:tiny", "-o", "o.xyz"], stderr, tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z.safetensors"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_decode_succeeds_with_stderr_closed_or_full(tmp_path, z, stderr):
    done = _run([*DECODE, z, "--model", "random:tiny", "-o", "o.npy", "--no-compile-cache", "--json"], stderr, tmp_path)
    assert done.returncode == 0 and '"outputs"' in done.stdout
    assert (tmp_path / "o.npy").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "summary"])
def test_a_full_stdout_after_the_outputs_are_written_is_exit_5_in_one_line(tmp_path, z, flags):
    with open("/dev/full", "w") as full:
        done = subprocess.run([*DECODE, z, "--model", "random:tiny", "-o", "o.npy", "--no-compile-cache", *flags],
                              cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 5, done.stderr
    last = done.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: the run is complete (outputs written) but its summary could not be printed")
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert (tmp_path / "o.npy").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_changes_nothing_for_bad_input_or_a_quiet_run(tmp_path, z):
    with open("/dev/full", "w") as full:
        bad = subprocess.run([*DECODE, z, "--model", "random:tiny", "-o", "o.xyz"], cwd=tmp_path, stdout=full,
                             stderr=subprocess.PIPE, text=True)
        quiet = subprocess.run([*DECODE, z, "--model", "random:tiny", "-o", "o.npy", "--no-compile-cache", "--quiet"],
                               cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True)
    assert bad.returncode == 2 and quiet.returncode == 0, (bad.stderr, quiet.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.npy", "z.safetensors"]
