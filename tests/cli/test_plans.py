"""The command lines' memory flags: --max-memory, --dry-run, exit 3 when no plan fits (tiny config, in-process)."""

import json
import re

import pytest
import torch
from safetensors.torch import save_file

from cogvideox_torchax.cli import decode, encode
from tests.support.cli import assert_bad_input

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
    # As the run would: an mp4 streams when its programs fit the budget.
    assert summary["dry_run"] is True and summary["memory_plan"]["name"] == "streamed" and summary["streamed"] is True
    assert 0 < summary["memory_plan"]["bytes"] <= summary["memory_plan"]["budget"]
    for flags, why in ((["--no-stream"], "--no-stream"), (["-o", str(tmp_path / "out.npy")], "one array")):
        assert decode.main([str(z), *TINY, "-o", str(tmp_path / "out.mp4"), "--dry-run", "--json", *flags]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["memory_plan"]["name"] == "whole" and summary["streamed"] is False
        assert why in summary["stream_why_not"]
    assert sorted(tmp_path.rglob("*")) == before


def test_no_plan_fits_is_exit_3_before_anything_is_written(tmp_path, capsys):
    # The whole decode of (1,4,1,8,12) compiles to 1.1-1.2 MiB, its smallest tiling to 0.7 MiB.
    z = _latents(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert decode.main([str(z), *TINY, "-o", str(tmp_path / "out.mp4"), "--max-memory", "500KB"]) == 3
    err = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert err.startswith("error: no plan for the decode of (1, 4, 1, 8, 12) fits 0.4 MiB per device")
    whole = re.search(r": whole (\d+\.\d) MiB; tiles of", err)
    assert whole and 0.43 < float(whole.group(1)) < 4, err  # over the 450,000 bytes usable (0.43 MiB)
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


def _exhausted_first(monkeypatch, calls: int):
    """The device runs out of memory on the first ``calls`` runs of the VAE's programs, then has enough."""
    import jax

    import cogvideox_torchax as ct

    real = ct.TorchaxVAE.prepare
    seen = []

    def prepare(self, kind, x, inputs=()):
        executable, args = real(self, kind, x, inputs)
        seen.append(self.planned(tuple(x.shape), kind=kind).name)

        def run(*a):
            if len(seen) <= calls:
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50MiB.")
            return executable(*a)

        return run, args

    monkeypatch.setattr(ct.TorchaxVAE, "prepare", prepare)
    return seen


def test_out_of_memory_under_auto_retries_once_with_the_next_plan(tmp_path, capsys, monkeypatch):
    seen = _exhausted_first(monkeypatch, calls=1)
    z = _latents(tmp_path)
    argv = [str(z), *TINY[:-1], "-o", str(tmp_path / "out.mp4"), "--json", "--no-stream"]
    assert decode.main(argv) == 0
    captured = capsys.readouterr()
    assert seen[0] == "whole" and seen[1].startswith("tiles of")
    assert "retrying once with the tiles of" in captured.err
    assert json.loads(captured.out)["memory_plan"]["name"] == seen[1] and (tmp_path / "out.mp4").exists()


def test_out_of_memory_inside_the_vae_is_retried_once_told_by_the_command_alone(tmp_path, capsys, monkeypatch):
    # The VAE's executable fails: its retry, the only one, takes the command's steps: one retry, one warning
    # line, no library warning on top.
    import warnings

    import jax

    import cogvideox_torchax as ct
    from cogvideox_torchax.memory.retry import PlanReplacedWarning

    real = ct.TorchaxVAE.prepare
    runs = []

    def prepare(self, kind, x, inputs=()):
        executable, args = real(self, kind, x, inputs)
        runs.append(self.planned(tuple(x.shape), kind=kind).name)

        def run(*a):
            if len(runs) == 1:
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50MiB.")
            return executable(*a)

        return run, args

    monkeypatch.setattr(ct.TorchaxVAE, "prepare", prepare)
    from cogvideox_torchax.cli import errors

    monkeypatch.setattr(errors, "_warned", set())  # warned once per process: earlier tests said the same line
    z = _latents(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanReplacedWarning)
        assert decode.main([str(z), *TINY[:-1], "-o", str(tmp_path / "out.mp4"), "--no-stream"]) == 0
    err = capsys.readouterr().err
    assert runs[0] == "whole" and runs[1].startswith("tiles of") and len(runs) == 2
    assert err.count("retrying once with the tiles of") == 1 and (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("output", ["out.mp4", "out.npy"])
def test_out_of_memory_outside_the_vaes_calls_is_exit_3_all_the_same(tmp_path, capsys, monkeypatch, output):
    # Past the VAE's own call (its retry's reach): the raw output's float32 copy, or the frames, on a device full.
    import jax

    import cogvideox_torchax as ct

    def exhausted(self, z):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50MiB.")

    monkeypatch.setattr(ct.TorchaxVAE, "decode_frames_jax", exhausted)
    monkeypatch.setattr(ct.TorchaxVAE, "decode_jax", exhausted)
    z = _latents(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert decode.main([str(z), *TINY, "-o", str(tmp_path / output), "--no-stream"]) == 3
    err = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert err.startswith("error: out of memory decoding latents of shape (1, 4, 1, 8, 12)") and "asked 1.50MiB" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_out_of_memory_twice_is_exit_3_naming_asked_bytes_and_the_flag(tmp_path, capsys, monkeypatch):
    _exhausted_first(monkeypatch, calls=2)
    z = _latents(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert decode.main([str(z), *TINY, "-o", str(tmp_path / "out.mp4"), "--no-stream"]) == 3
    err = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert err.startswith("error: out of memory decoding latents of shape (1, 4, 1, 8, 12)") and "asked 1.50MiB" in err
    assert err.count("out of memory") == 1 and err.count("the plan (") == 1  # told once, not wrapped again
    assert "the plan (tiles of" in err  # the retried plan's bytes, then what would come next
    assert "no smaller plan exists" in err or re.search(r"--max-memory \d+MiB would run the tiles of", err)
    assert sorted(tmp_path.rglob("*")) == before


def test_out_of_memory_with_a_given_budget_names_the_flag_that_would_fit(tmp_path, capsys, monkeypatch):
    _exhausted_first(monkeypatch, calls=1)
    z = _latents(tmp_path)
    assert decode.main([str(z), *TINY, "-o", str(tmp_path / "out.mp4"), "--max-memory", "1GiB", "--no-stream"]) == 3
    err = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    compiled = re.search(r"the plan \(whole\) compiled to (\d+\.\d) MiB per device", err)
    assert compiled and 0.5 < float(compiled.group(1)) < 4, err  # the tiny whole decode, about 1.1 MiB
    flag = re.search(r"--max-memory (\d+)MiB would run the (tiles of \S+ latents) plan \((\d+\.\d) MiB\)", err)
    assert flag, err
    assert int(flag.group(1)) * 0.9 >= float(flag.group(3))  # that budget does fit the plan


def test_next_plan_reported_but_not_chosen_keeps_the_plan(tiny_vae):
    # The out-of-memory line's hint plans the next smaller plan; a
    # many-latents run goes on after it, on the plan it had, compiled.
    shape = (1, 4, 1, 8, 12)
    plan = tiny_vae.memory_plan(shape)
    executable = tiny_vae.compile_decode(shape)
    smaller = tiny_vae.next_plan(shape, choose=False)
    assert smaller.name.startswith("tiles of") and smaller.bytes < plan.bytes
    assert tiny_vae.planned(shape) == plan and tiny_vae.compile_decode(shape) is executable


def test_out_of_memory_while_streaming_under_auto_decodes_with_the_plan_instead(tmp_path, capsys, monkeypatch):
    import jax

    import cogvideox_torchax as ct

    def exhausted(self, z, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50MiB.")
        yield  # a generator, as decode_stream is

    monkeypatch.setattr(ct.TorchaxVAE, "decode_stream", exhausted)
    z = _latents(tmp_path)
    assert decode.main([str(z), *TINY[:-1], "-o", str(tmp_path / "out.mp4"), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["streamed"] is False and "ran out of memory" in summary["stream_why_not"]
    assert summary["memory_plan"]["name"] == "whole" and (tmp_path / "out.mp4").exists()
    assert "out of memory while streaming" in captured.err
    # Under a given --max-memory the same is exit 3, nothing written.
    before = sorted(tmp_path.iterdir())
    argv = [str(z), *TINY[:-1], "-o", str(tmp_path / "again.mp4"), "--max-memory", "8GiB"]
    assert decode.main(argv) == 3 and sorted(tmp_path.iterdir()) == before
