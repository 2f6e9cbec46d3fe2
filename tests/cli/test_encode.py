"""python -m cogvideox_torchax.encode: a round trip through the decode command, fitting rules, bad input.

The runs use the tiny config (4 latent channels, scaling factor 1.15258426)
and compare with the library encode of the same frames.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

import cogvideox_torchax as ct
from cogvideox_torchax.encode import main
from cogvideox_torchax.io import frames
from cogvideox_torchax.io.video import encode_mp4, read_mp4
from tests.support.cli import assert_bad_input
from tests.support.parity import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1"]


def _clip(num_frames, height, width):
    """A moving colour gradient, ``(F, H, W, 3)`` uint8."""
    t = np.arange(num_frames)[:, None, None]
    y = np.arange(height)[None, :, None]
    x = np.arange(width)[None, None, :]
    clip = np.zeros((num_frames, height, width, 3), np.uint8)
    clip[..., 0] = (x * 5 + t * 12) % 256
    clip[..., 1] = (y * 7 + t * 3) % 256
    clip[..., 2] = 96
    return clip


def _cli(module, *argv):
    cmd = [sys.executable, "-m", f"cogvideox_torchax.{module}", *map(str, argv), *TINY, "--no-compile-cache"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    return proc


def _library_latents(clip_fhw3, seed=0):
    vae = ct.wrap(ct.random_upstream("tiny", seed=seed), mesh="dp=1,tp=1")
    z = vae.encode(torch.from_numpy(frames.to_video_tensor(clip_fhw3))).latent_dist.mode()
    return z.permute(0, 2, 1, 3, 4) * vae.config.scaling_factor  # as the pipeline holds them


def test_mp4_round_trip_through_the_decode_command(tmp_path):
    # 9 frames (8k+1) of 32x48 (multiples of 8): used whole, and decoded back
    # to the same frame count and size.
    encode_mp4(tmp_path / "in.mp4", _clip(9, 32, 48), fps=8, crf=0)
    proc = _cli("encode", tmp_path / "in.mp4", "-o", tmp_path / "z.safetensors", "--json")
    summary = json.loads(proc.stdout)
    assert summary["input_shape"] == [9, 32, 48] and summary["video_shape"] == [1, 3, 9, 32, 48]
    assert summary["latents_shape"] == [1, 3, 4, 4, 6] and summary["layout"] == "BTCHW"
    assert summary["fps"] == 8
    assert all(stage in proc.stderr for stage in ("read", "load", "compile", "encode", "write"))
    assert "100%" in proc.stderr  # the progress bars

    with safe_open(tmp_path / "z.safetensors", framework="pt") as f:
        assert list(f.keys()) == ["latents"]
        assert f.metadata()["layout"] == "BTCHW" and f.metadata()["posterior"] == "mode"
        got = f.get_tensor("latents")
    decoded_mp4, _ = read_mp4(tmp_path / "in.mp4")  # what the command read, after H.264
    # fp32, same program: measured 0.
    assert_close(got, _library_latents(decoded_mp4), atol=1e-5, label="CLI latents vs library")

    # The decode command reads them back with no layout or scaling flags.
    proc = _cli("decode", tmp_path / "z.safetensors", "-o", tmp_path / "out.mp4", "--json")
    assert json.loads(proc.stdout)["layout"] == "BTCHW"
    out, _ = read_mp4(tmp_path / "out.mp4")
    assert out.shape == (9, 32, 48, 3)  # the original's frame count and size


def test_default_fit_crops_and_cuts_to_what_round_trips(tmp_path, capsys):
    # 10 frames of 36x50 -> 9 frames (8k+1) of 32x48 (multiples of 8), centred.
    encode_mp4(tmp_path / "in.mp4", _clip(10, 36, 50), fps=8, crf=0)
    assert main([str(tmp_path / "in.mp4"), "-o", str(tmp_path / "z.safetensors"), *TINY, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["input_shape"] == [10, 36, 50] and summary["video_shape"] == [1, 3, 9, 32, 48]
    # Called as a function: the timeline starts at the call; its parts add up to it.
    t = summary["timeline"]
    assert t["origin"] == "main() call" and t["parts_s"]["python"] == 0.0
    assert {"read", "compile", "encode"} <= set(t["parts_s"])
    assert sum(t["parts_s"].values()) == pytest.approx(t["total_s"], abs=0.01)
    decoded_mp4, _ = read_mp4(tmp_path / "in.mp4")
    expected = _library_latents(decoded_mp4[:9, 2:34, 1:49])
    assert_close(load_file(tmp_path / "z.safetensors")["latents"], expected, atol=1e-5, label="cropped")


def test_frame_folder_size_frames_and_sample(tmp_path, capsys):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, frame in enumerate(_clip(6, 20, 30)):
        Image.fromarray(frame).save(folder / f"{i:03d}.png")
    (folder / "notes.txt").write_text("ignored")
    out = tmp_path / "z.safetensors"
    argv = [str(folder), "-o", str(out), "--size", "16x32", "--frames", "5", "--sample", "--sample-seed", "3", *TINY]
    assert main([*argv, "--no-compile-cache", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["video_shape"] == [1, 3, 5, 16, 32] and summary["posterior"] == "sample"
    assert summary["fps"] is None

    # 20x30 scaled by 32/30 to cover 16x32 (21x32), then centre-cropped.
    read = np.stack([np.asarray(Image.open(p)) for p in sorted(folder.glob("*.png"))])
    fitted = frames.fit(read, size=(16, 32), num_frames=5)
    assert fitted.shape == (5, 16, 32, 3)
    vae = ct.wrap(ct.random_upstream("tiny"), mesh="dp=1,tp=1")
    posterior = vae.encode(torch.from_numpy(frames.to_video_tensor(fitted))).latent_dist
    expected = posterior.sample(generator=torch.Generator().manual_seed(3)).permute(0, 2, 1, 3, 4)
    assert_close(load_file(out)["latents"], expected * vae.config.scaling_factor, atol=1e-5, label="sampled")


def test_float16_encode_equals_the_library(tmp_path, capsys):
    folder = tmp_path / "frames"
    folder.mkdir()
    clip = _clip(5, 16, 24)
    for i, frame in enumerate(clip):
        Image.fromarray(frame).save(folder / f"{i:03d}.png")
    out = tmp_path / "z.safetensors"
    assert main([str(folder), "-o", str(out), "--dtype", "fp16", *TINY, "--no-compile-cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float16"
    vae = ct.wrap(ct.random_upstream("tiny").half(), mesh="dp=1,tp=1")
    assert vae.dtype == torch.float16
    x = torch.from_numpy(frames.to_video_tensor(frames.fit(clip)))
    expected = vae.encode(x).latent_dist.mode().float().permute(0, 2, 1, 3, 4) * vae.config.scaling_factor
    got = load_file(out)["latents"]
    # The same program on the same frames; the file keeps what the command wrote.
    assert_close(got.float(), expected.float(), atol=1e-3, label="CLI fp16 latents vs library", check_dtype=False)


@pytest.mark.parametrize("available,expected", [(1, 1), (5, 1), (8, 1), (9, 9), (16, 9), (17, 17), (49, 49), (50, 49)])
def test_default_frame_count_is_8k_plus_1(available, expected):
    assert frames.default_frame_count(available) == expected


def test_fit_crops_to_multiples_of_8_by_default():
    clip = _clip(3, 23, 41)
    fitted = frames.fit(clip)
    assert fitted.shape == (1, 16, 40, 3)
    assert np.array_equal(fitted[0], clip[0, 3:19, 0:40])  # centred: (23-16)//2 = 3 rows above


def test_video_tensor_is_diffusers_normalisation():
    clip = _clip(2, 8, 8)
    x = frames.to_video_tensor(clip)
    assert x.shape == (1, 3, 2, 8, 8) and x.dtype == np.float32
    assert np.array_equal(x[0, :, 1], clip[1].transpose(2, 0, 1).astype(np.float32) / 255 * 2 - 1)


# -- bad input: exit 2, one line, nothing written ----------------------------


def _bad(tmp_path, capsys, argv, message):
    assert_bad_input(main, tmp_path, capsys, argv, message)


@pytest.fixture
def good_mp4(tmp_path):
    path = tmp_path / "in.mp4"
    encode_mp4(path, _clip(2, 16, 16), fps=8, crf=0)
    return path


def _out(tmp_path):
    return ["-o", str(tmp_path / "z.safetensors")]


def test_missing_video(tmp_path, capsys):
    _bad(tmp_path, capsys, [str(tmp_path / "missing.mp4"), *TINY, *_out(tmp_path)], "no such video or frame folder")


def test_unknown_file_type(tmp_path, capsys):
    (tmp_path / "clip.gif").write_bytes(b"GIF89a")
    _bad(tmp_path, capsys, [str(tmp_path / "clip.gif"), *TINY, *_out(tmp_path)], "expected a video")


def test_corrupt_mp4(tmp_path, capsys):
    (tmp_path / "bad.mp4").write_bytes(b"\x00" * 64)
    _bad(tmp_path, capsys, [str(tmp_path / "bad.mp4"), *TINY, *_out(tmp_path)], "cannot decode video")


def test_empty_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _bad(tmp_path, capsys, [str(tmp_path / "empty"), *TINY, *_out(tmp_path)], "holds no frames")


def test_frames_of_different_sizes(tmp_path, capsys):
    folder = tmp_path / "frames"
    folder.mkdir()
    Image.fromarray(_clip(1, 16, 16)[0]).save(folder / "0.png")
    Image.fromarray(_clip(1, 16, 24)[0]).save(folder / "1.png")
    _bad(tmp_path, capsys, [str(folder), *TINY, *_out(tmp_path)], r"is 16x24 \(HxW\), the first frame 16x16")


def test_unreadable_frame(tmp_path, capsys):
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "0.png").write_bytes(b"not a png")
    _bad(tmp_path, capsys, [str(folder), *TINY, *_out(tmp_path)], "cannot read frame")


def _png_header(width: int, height: int) -> bytes:
    # A PNG that declares its size and holds no pixels: signature, IHDR, IEND.
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_a_frame_declaring_too_many_pixels_is_bad_input(tmp_path, capsys):
    # Pillow's DecompressionBombError is neither OSError nor ValueError.
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "0.png").write_bytes(_png_header(20000, 20000))
    _bad(tmp_path, capsys, [str(folder), *TINY, *_out(tmp_path)],
         r"cannot read frame .*0\.png.*DecompressionBombError.*exceeds limit of \d+ pixels")


@pytest.mark.parametrize("reader", ["image", "video"])
def test_any_exception_class_of_the_decoders_is_bad_input(tmp_path, capsys, monkeypatch, reader):
    # Closed as a class: whatever Pillow or PyAV raise on a user's file (here
    # a class neither library has today) is exit 2 naming the file.
    import av
    from PIL import Image

    class DecoderOwnError(Exception):
        pass

    def refuse(*args, **kwargs):
        raise DecoderOwnError("bad bits")

    if reader == "image":
        folder = tmp_path / "frames"
        folder.mkdir()
        Image.fromarray(_clip(1, 16, 16)[0]).save(folder / "0.png")
        monkeypatch.setattr(Image, "open", refuse)
        argv, name = [str(folder), *TINY, *_out(tmp_path)], "0.png"
    else:
        path = tmp_path / "in.mp4"
        encode_mp4(path, _clip(2, 16, 16), fps=8, crf=0)
        monkeypatch.setattr(av, "open", refuse)
        argv, name = [str(path), *TINY, *_out(tmp_path)], "in.mp4"
    _bad(tmp_path, capsys, argv, rf"{name}.*DecoderOwnError: bad bits")


def test_too_small(tmp_path, capsys):
    path = tmp_path / "tiny.mp4"
    encode_mp4(path, _clip(1, 16, 6), crf=0)  # H.264 needs even sizes; 6 < 8 wide
    _bad(tmp_path, capsys, [str(path), *TINY, *_out(tmp_path)], "at least 8x8")


def test_more_frames_than_the_video_has(tmp_path, capsys, good_mp4):
    _bad(tmp_path, capsys, [str(good_mp4), "--frames", "3", *TINY, *_out(tmp_path)], "cannot take 3 frames from")


@pytest.mark.parametrize("size,message", [("16x20", "multiples of 8"), ("big", "HEIGHTxWIDTH")])
def test_bad_size(tmp_path, capsys, good_mp4, size, message):
    _bad(tmp_path, capsys, [str(good_mp4), "--size", size, *TINY, *_out(tmp_path)], message)


def test_output_must_be_safetensors(tmp_path, capsys, good_mp4):
    _bad(tmp_path, capsys, [str(good_mp4), *TINY, "-o", str(tmp_path / "z.npy")], "must be a .safetensors")


def test_output_exists(tmp_path, capsys, good_mp4):
    existing = tmp_path / "z.safetensors"
    existing.write_bytes(b"keep")
    _bad(tmp_path, capsys, [str(good_mp4), *TINY, "-o", str(existing)], "exists; pass --overwrite")
    assert existing.read_bytes() == b"keep"


def test_unknown_random_preset(tmp_path, capsys, good_mp4):
    _bad(tmp_path, capsys, [str(good_mp4), "--model", "random:huge", *_out(tmp_path)], "unknown preset 'huge'")


def test_a_size_the_host_cannot_hold_is_exit_3_before_fitting(tmp_path, capsys, good_mp4):
    before = sorted(tmp_path.rglob("*"))
    assert main([str(good_mp4), "--size", "100000x100000", *TINY, *_out(tmp_path), "--no-compile-cache"]) == 3
    last = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: fitting the video to 100000x100000 needs") and "of host memory" in last, last
    assert "--size" in last and sorted(tmp_path.rglob("*")) == before
