"""python -m cogvideox_torchax.decode: a real run, and bad input without output."""

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.decode import main
from tests.parity import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def latents(tmp_path):
    z = torch.randn((1, 4, 2, 3, 4), generator=torch.Generator().manual_seed(5))
    path = tmp_path / "z.safetensors"
    save_file({"latents": z}, path)
    return path, z


def test_decode_writes_the_library_result(latents, tmp_path):
    path, z = latents
    out = tmp_path / "video.npy"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cogvideox_torchax.decode",
            str(path),
            "--model",
            "random:tiny",
            "--seed",
            "7",
            "--mesh",
            "dp=1,tp=1",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"load [\d.]+ s \| compile [\d.]+ s \| decode [\d.]+ s", proc.stdout), proc.stdout
    expected = ct.wrap(ct.random_upstream("tiny", seed=7), mesh="dp=1,tp=1").decode(z).sample
    assert_close(np.load(out), expected.numpy(), atol=1e-6, label="CLI vs library")


def test_safetensors_output_and_json(latents, tmp_path, capsys):
    path, _ = latents
    out = tmp_path / "video.safetensors"
    assert main([str(path), "--model", "random:tiny", "--mesh", "dp=1,tp=1", "-o", str(out), "--json"]) == 0
    assert '"video_shape": [1, 3, 8, 24, 32]' in capsys.readouterr().out
    assert out.is_file()


def _bad(tmp_path, capsys, argv, message):
    before = set(tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert set(tmp_path.iterdir()) == before  # nothing written, no temp left


def test_bad_inputs(latents, tmp_path, capsys):
    path, z = latents
    out = str(tmp_path / "o.npy")
    tiny = ["--model", "random:tiny", "--mesh", "dp=1,tp=1"]
    _bad(tmp_path, capsys, [str(tmp_path / "missing.safetensors"), *tiny, "-o", out], "no such latents file")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    _bad(tmp_path, capsys, [str(junk), *tiny, "-o", out], "not a readable safetensors")
    two = tmp_path / "two.safetensors"
    save_file({"a": z, "b": z.clone()}, two)
    _bad(tmp_path, capsys, [str(two), *tiny, "-o", out], "pick one with --key: a, b")
    _bad(tmp_path, capsys, [str(two), "--key", "c", *tiny, "-o", out], "no tensor 'c'.*keys: a, b")
    nan = tmp_path / "nan.safetensors"
    save_file({"z": torch.full((1, 4, 1, 2, 2), float("nan"))}, nan)
    _bad(tmp_path, capsys, [str(nan), *tiny, "-o", out], "NaN or Inf")
    wrong = tmp_path / "wrong.safetensors"
    save_file({"z": torch.zeros(1, 16, 1, 2, 2)}, wrong)
    _bad(tmp_path, capsys, [str(wrong), *tiny, "-o", out], "4 channels")
    _bad(tmp_path, capsys, [str(path), *tiny, "-o", str(tmp_path / "o.mp5")], "unknown output extension")
    _bad(tmp_path, capsys, [str(path), *tiny, "-o", str(tmp_path / "no" / "o.npy")], "does not exist")
    _bad(tmp_path, capsys, [str(path), "--model", "random:huge", "-o", out], "unknown preset 'huge'")
    _bad(tmp_path, capsys, [str(path), "--model", "random:tiny", "--mesh", "dp=4,tp=4", "-o", out], "needs 16 devices")
    _bad(tmp_path, capsys, [str(path), "--model", str(tmp_path), "-o", out], "no config.json")
    existing = tmp_path / "exists.npy"
    existing.write_bytes(b"keep")
    _bad(tmp_path, capsys, [str(path), *tiny, "-o", str(existing)], "exists; pass --overwrite")
    assert existing.read_bytes() == b"keep"
