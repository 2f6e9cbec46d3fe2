"""The command lines' memory flags: --max-memory, --dry-run, exit 3 when no plan fits (tiny config, in-process)."""

import json

import torch
from safetensors.torch import save_file

from cogvideox_torchax import decode, encode
from tests.cli import assert_bad_input

TINY = ["--model", "random:tiny", "--no-unscale", "--no-compile-cache", "--quiet"]


def _latents(tmp_path, shape=(1, 4, 1, 8, 12)):
    path = tmp_path / "z.safetensors"
    save_file({"latents": torch.randn(shape, generator=torch.Generator().manual_seed(0))}, path)
    return path


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    z = _latents(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert decode.main([str(z), *TINY, "-o", str(tmp_path / "out.mp4"), "--dry-run", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dry_run"] is True and summary["memory_plan"]["name"] == "whole"
    assert 0 < summary["memory_plan"]["bytes"] <= summary["memory_plan"]["budget"]
    assert sorted(tmp_path.rglob("*")) == before


def test_no_plan_fits_is_exit_3_before_anything_is_written(tmp_path, capsys):
    # The whole decode of (1,4,1,8,12) compiles to 1.2 MiB, its smallest tiling to 0.8 MiB.
    z = _latents(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert decode.main([str(z), *TINY, "-o", str(tmp_path / "out.mp4"), "--max-memory", "500KB"]) == 3
    err = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert err.startswith("error: no plan for the decode of (1, 4, 1, 8, 12) fits") and "whole 1.2 MiB" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_bad_max_memory_is_refused_before_loading(tmp_path, capsys):
    z = _latents(tmp_path)
    argv = [str(z), "--model", "random:tiny", "-o", str(tmp_path / "out.mp4"), "--max-memory", "plenty"]
    assert_bad_input(decode.main, tmp_path, capsys, argv, "--max-memory: memory budget must be")
    video = tmp_path / "v.safetensors"
    argv = [str(z), "--model", "random:tiny", "-o", str(video), "--max-memory=-3GB"]
    assert_bad_input(encode.main, tmp_path, capsys, argv, "--max-memory")


def test_encode_dry_run_plans_the_encode(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    folder = tmp_path / "clip"
    folder.mkdir()
    for i in range(9):
        Image.fromarray(np.full((16, 16, 3), 20 * i, np.uint8)).save(folder / f"{i:03d}.png")
    before = sorted(tmp_path.rglob("*"))
    out = tmp_path / "z.safetensors"
    assert encode.main([str(folder), "--model", "random:tiny", "-o", str(out), "--dry-run", "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dry_run"] and summary["video_shape"] == [1, 3, 9, 16, 16]
    assert summary["memory_plan"]["name"] == "whole" and summary["memory_plan"]["bytes"] > 0
    assert sorted(tmp_path.rglob("*")) == before
