"""python -m cogvideox_torchax.decode: real runs read back, and bad input without output.

The subprocess runs use the tiny config (4 latent channels, scaling factor
1.15258426) and compare with the library decode of the same latents.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.decode import main
from cogvideox_torchax.io.video import read_mp4, to_uint8
from tests.support.cli import assert_bad_input
from tests.support.parity import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1"]


def _z(shape, seed=5):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _cli(*argv, cache=None):
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "cogvideox_torchax.decode", *map(str, argv)]
    if cache is None:
        cmd.append("--no-compile-cache")
    else:
        cmd += ["--compile-cache", str(cache)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def _library(z_bcthw, seed=0):
    vae = ct.wrap(ct.random_upstream("tiny", seed=seed), mesh="dp=1,tp=1")
    return vae, vae.decode(z_bcthw).sample.numpy()


def test_mp4_pipeline_layout_batch_2(tmp_path):
    # As CogVideoXPipeline(output_type="latent") hands them over: (B, T, C, H, W), still scaled.
    z_btchw = _z((2, 3, 4, 3, 4))
    save_file({"latents": z_btchw}, tmp_path / "z.safetensors")
    proc = _cli(tmp_path / "z.safetensors", *TINY, "-o", tmp_path / "clip.mp4", "--crf", "0", "--fps", "10", "--json")
    summary = json.loads(proc.stdout)
    assert summary["layout"] == "BTCHW" and summary["unscaled"] is True
    assert summary["plan"]["target"]["platform"] == "cpu" and "frame_scan" in summary["plan"]["steps"]
    assert "decode" in proc.stderr and "100%" in proc.stderr  # the progress bars
    assert not (tmp_path / "clip.mp4").exists()

    vae, expected = _library(z_btchw.permute(0, 2, 1, 3, 4) * (1 / vae_scaling("tiny")))
    expected_frames = to_uint8(expected)  # (B, F, H, W, 3)
    assert expected_frames.shape == (2, 9, 24, 32, 3)  # 3 latent frames -> 9, 8x upsampled
    for i in range(2):
        frames, fps = read_mp4(tmp_path / f"clip_{i}.mp4")
        assert frames.shape == expected_frames[i].shape
        assert fps == 10
        # Lossless H.264 (crf 0, yuv444p): only the RGB <-> YUV conversion
        # rounds, by at most 2 levels (measured on a gradient clip: 2).
        diff = np.abs(frames.astype(int) - expected_frames[i].astype(int))
        print(f"[mp4] video {i}: max diff {diff.max()} levels, mean {diff.mean():.3f}")
        assert diff.max() <= 2 and diff.mean() < 1


def vae_scaling(preset):
    return ct.random_upstream(preset).config.scaling_factor


def test_png_folder_without_unscale_and_warm_compile_cache(tmp_path):
    z = _z((1, 4, 2, 3, 4), seed=6)
    save_file({"latents": z}, tmp_path / "z.safetensors")
    cache = tmp_path / "cache"
    first = json.loads(
        _cli(tmp_path / "z.safetensors", *TINY, "--no-unscale", "-o", tmp_path / "frames", "--json", cache=cache).stdout
    )
    assert first["layout"] == "BCTHW" and first["unscaled"] is False
    assert first["compile_cache"] == "miss"
    _, expected = _library(z)
    pngs = sorted((tmp_path / "frames").iterdir())
    assert [p.name for p in pngs] == [f"frame_{i:04d}.png" for i in range(8)]  # 2 latent frames -> 8
    got = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in pngs])
    diff = np.abs(got.astype(int) - to_uint8(expected)[0].astype(int))
    assert diff.max() <= 1  # PNG is lossless; 1 level for a rounding tie
    # A second process with the same cache compiles nothing.
    second = json.loads(
        _cli(
            tmp_path / "z.safetensors",
            *TINY,
            "--no-unscale",
            "-o",
            tmp_path / "frames",
            "--overwrite",
            "--json",
            cache=cache,
        ).stdout
    )
    assert second["compile_cache"] == "hit"


def test_raw_npy_matches_the_library_and_prints_a_summary(tmp_path):
    z = _z((1, 4, 2, 3, 4))
    save_file({"latents": z}, tmp_path / "z.safetensors")
    proc = _cli(
        tmp_path / "z.safetensors",
        "--model",
        "random:tiny",
        "--seed",
        "7",
        "--mesh",
        "dp=1,tp=1",
        "-o",
        tmp_path / "video.npy",
    )
    assert re.search(r"load [\d.]+ s \| compile [\d.]+ s \(cache off\) \| decode [\d.]+ s", proc.stdout), proc.stdout
    _, expected = _library(z * (1 / vae_scaling("tiny")), seed=7)
    assert_close(np.load(tmp_path / "video.npy"), expected[0], atol=1e-6, label="CLI raw vs library")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_latents_and_quiet(tmp_path, capsys, dtype):
    z = _z((1, 4, 1, 2, 3)).to(dtype)
    save_file({"z": z}, tmp_path / "z.safetensors")
    out = tmp_path / "v.safetensors"
    args = [str(tmp_path / "z.safetensors"), *TINY, "--no-compile-cache", "-o", str(out), "--quiet"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    from safetensors.numpy import load_file

    _, expected = _library(z.float() * (1 / vae_scaling("tiny")))
    assert_close(load_file(out)["video"], expected[0], atol=1e-6, label=f"{dtype} latents")


@pytest.mark.parametrize("spelling", ["float16", "fp16"])
def test_float16_decode_equals_the_library(tmp_path, capsys, spelling):
    z = _z((1, 4, 2, 2, 3))
    save_file({"z": z}, tmp_path / "z.safetensors")
    out = tmp_path / "v.npy"
    args = [str(tmp_path / "z.safetensors"), *TINY, "--dtype", spelling, "--no-compile-cache", "-o", str(out), "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float16"
    vae = ct.wrap(ct.random_upstream("tiny"), dtype=spelling, mesh="dp=1,tp=1")
    expected = vae.decode(z * (1 / vae_scaling("tiny"))).sample
    # The same program on the same input: measured equal (raw frames are written as float32).
    assert_close(torch.from_numpy(np.load(out)), expected[0].float(), atol=0, label="CLI fp16 vs library")


# float16's largest value is 65504. Latents x 1e4 fit in it (2.4e4 after
# unscaling) but the decoder's activations do not: the run is refused,
# naming float16, for raw and uint8 outputs alike (the mp4 program flags a
# non-finite video on device); x 1e5 is refused before decoding.
@pytest.mark.parametrize(("scale", "output", "message"), [
    (1e4, "v.npy", r"decode produced NaN or Inf: .*2\.41e\+04.*float16 overflows above 65504"),
    (1e4, "v.mp4", r"decode produced NaN or Inf: .*float16 computation \(float16 overflows above 65504"),
    (1e5, "v.npy", r"values up to 2\.41e\+05 .* out of range for float16 \(largest 6\.55e\+04\)"),
])
def test_float16_overflow_is_refused_naming_the_cause(tmp_path, capsys, scale, output, message):
    save_file({"z": _z((1, 4, 3, 4, 4)) * scale}, tmp_path / "z.safetensors")
    _bad(tmp_path, capsys, [str(tmp_path / "z.safetensors"), *TINY, "--dtype", "float16", "-o", str(tmp_path / output)],
         message)
    # The same latents decode in float32.
    argv = [str(tmp_path / "z.safetensors"), *TINY, "--no-compile-cache", "--quiet", "-o", str(tmp_path / output)]
    assert main(argv) == 0


def test_layout_override_resolves_ambiguity(tmp_path, capsys):
    z = _z((1, 4, 4, 2, 2))  # C == T == 4: ambiguous for the tiny model
    save_file({"z": z}, tmp_path / "z.safetensors")
    base = [str(tmp_path / "z.safetensors"), *TINY, "--no-compile-cache", "--json"]
    assert main([*base, "-o", str(tmp_path / "a.npy")]) == 2
    assert "ambiguous" in capsys.readouterr().err
    assert main([*base, "--layout", "BTCHW", "-o", str(tmp_path / "b.npy")]) == 0
    assert json.loads(capsys.readouterr().out)["layout"] == "BTCHW"
    assert np.load(tmp_path / "b.npy").shape == (3, 16, 16, 16)  # T = 4 after the swap -> 16 frames, 2x2 -> 16x16


def _bad(tmp_path, capsys, argv, message):
    assert_bad_input(main, tmp_path, capsys, argv, message)


@pytest.fixture
def good(tmp_path):
    z = _z((1, 4, 2, 3, 4))
    path = tmp_path / "z.safetensors"
    save_file({"latents": z}, path)
    return str(path), z


def _out(tmp_path, name="o.npy"):
    return ["-o", str(tmp_path / name)]


def test_missing_file(tmp_path, capsys):
    _bad(tmp_path, capsys, [str(tmp_path / "missing.safetensors"), *TINY, *_out(tmp_path)], "no such latents file")


def test_not_safetensors(tmp_path, capsys):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    _bad(tmp_path, capsys, [str(junk), *TINY, *_out(tmp_path)], "not a readable safetensors")


def test_truncated_safetensors(tmp_path, capsys, good):
    data = pathlib.Path(good[0]).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) - 40])
    _bad(tmp_path, capsys, [str(cut), *TINY, *_out(tmp_path)], "not a readable safetensors")


def test_no_tensors(tmp_path, capsys):
    empty = tmp_path / "empty.safetensors"
    save_file({}, empty)
    _bad(tmp_path, capsys, [str(empty), *TINY, *_out(tmp_path)], "holds no tensors")


def test_several_tensors_without_key(tmp_path, capsys, good):
    two = tmp_path / "two.safetensors"
    save_file({"a": good[1], "b": good[1].clone()}, two)
    _bad(tmp_path, capsys, [str(two), *TINY, *_out(tmp_path)], "pick one with --key: a, b")


def test_unknown_key_lists_keys(tmp_path, capsys, good):
    two = tmp_path / "two.safetensors"
    save_file({"a": good[1], "b": good[1].clone()}, two)
    _bad(tmp_path, capsys, [str(two), "--key", "c", *TINY, *_out(tmp_path)], "no tensor 'c'.*keys: a, b")


def test_wrong_rank(tmp_path, capsys):
    p = tmp_path / "r.safetensors"
    save_file({"z": torch.zeros(4, 2, 3, 4)}, p)
    _bad(tmp_path, capsys, [str(p), *TINY, *_out(tmp_path)], "must be 5-D")


def test_channels_not_matching_the_model(tmp_path, capsys):
    p = tmp_path / "c.safetensors"
    save_file({"z": torch.zeros(1, 16, 1, 2, 2)}, p)
    _bad(tmp_path, capsys, [str(p), *TINY, *_out(tmp_path)], "no dimension with the model's 4 channels")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf(tmp_path, capsys, value):
    p = tmp_path / "n.safetensors"
    z = torch.zeros(1, 4, 1, 2, 2)
    z[0, 1, 0, 1, 1] = value
    save_file({"z": z}, p)
    _bad(tmp_path, capsys, [str(p), *TINY, *_out(tmp_path)], "NaN or Inf")


def test_zero_size_dimension(tmp_path, capsys):
    p = tmp_path / "e.safetensors"
    save_file({"z": torch.zeros(1, 4, 0, 2, 2)}, p)
    _bad(tmp_path, capsys, [str(p), *TINY, *_out(tmp_path)], "empty dimension")


def test_mesh_that_does_not_fit(tmp_path, capsys, good):
    _bad(
        tmp_path,
        capsys,
        [good[0], "--model", "random:tiny", "--mesh", "dp=4,tp=4", *_out(tmp_path)],
        "needs 16 devices",
    )


def test_unknown_random_preset(tmp_path, capsys, good):
    _bad(tmp_path, capsys, [good[0], "--model", "random:huge", *_out(tmp_path)], "unknown preset 'huge'")


def test_model_folder_without_config(tmp_path, capsys, good):
    folder = tmp_path / "model"
    folder.mkdir()
    _bad(tmp_path, capsys, [good[0], "--model", str(folder), *_out(tmp_path)], "no config.json")


def test_model_folder_without_weights(tmp_path, capsys, good):
    folder = tmp_path / "model"
    ct.random_upstream("tiny").save_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    _bad(tmp_path, capsys, [good[0], "--model", str(folder), *_out(tmp_path)], "no safetensors weights")


def test_model_folder_with_mismatched_weights(tmp_path, capsys, good):
    folder = tmp_path / "model"
    up = ct.random_upstream("tiny")
    up.save_pretrained(folder)
    from safetensors.torch import load_file

    (weights,) = folder.glob("*.safetensors")
    sd = load_file(weights)
    key = "decoder.conv_in.conv.weight"
    sd[key] = sd[key][:, :2].contiguous()
    save_file(sd, weights)
    _bad(tmp_path, capsys, [good[0], "--model", str(folder), *_out(tmp_path)], re.escape(key))


def test_output_exists(tmp_path, capsys, good):
    existing = tmp_path / "exists.npy"
    existing.write_bytes(b"keep")
    _bad(tmp_path, capsys, [good[0], *TINY, "-o", str(existing)], "exists; pass --overwrite")
    assert existing.read_bytes() == b"keep"


def test_batch_output_exists(tmp_path, capsys):
    p = tmp_path / "b.safetensors"
    save_file({"z": _z((2, 4, 1, 2, 2))}, p)
    (tmp_path / "v_1.mp4").write_bytes(b"keep")
    _bad(tmp_path, capsys, [str(p), *TINY, "-o", str(tmp_path / "v.mp4")], r"v_1\.mp4' exists")


def test_output_folder_missing(tmp_path, capsys, good):
    _bad(tmp_path, capsys, [good[0], *TINY, "-o", str(tmp_path / "no" / "o.npy")], "does not exist")


def test_output_folder_not_writable(tmp_path, capsys, good):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    target = locked
    if os.access(locked, os.W_OK):  # root ignores modes; a read-only mount does not
        target = pathlib.Path("/proc/sys")
        if not target.is_dir() or os.access(target, os.W_OK):
            pytest.skip("no unwritable folder available to this user")
    try:
        _bad(tmp_path, capsys, [good[0], *TINY, "-o", str(target / "o.npy")], "is not writable")
    finally:
        locked.chmod(0o700)


def test_unknown_output_extension(tmp_path, capsys, good):
    _bad(tmp_path, capsys, [good[0], *TINY, "-o", str(tmp_path / "o.avi")], "unknown output extension '.avi'")


@pytest.mark.parametrize("flags", [[], ["--no-stream"]], ids=["streamed", "whole"])
def test_failed_write_leaves_nothing(tmp_path, capsys, good, monkeypatch, flags):
    from cogvideox_torchax.io import video

    def explode(self, frames, tick=None):
        self.dest.write_bytes(b"half a video")  # the staged temporary file
        raise OSError("disk full")

    monkeypatch.setattr(video.FrameWriter, "write", explode)
    before = sorted(tmp_path.rglob("*"))
    assert main([good[0], *TINY, "--no-compile-cache", "-o", str(tmp_path / "v.mp4"), *flags]) == 1
    assert "OSError: disk full" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before
