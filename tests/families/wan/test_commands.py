"""The decode and encode commands on Wan: the pipeline's latents with no flags, round trips, Wan's own refusals.

In-process runs of ``main`` on the wan-tiny config (16 latent channels, the
default latents_mean / latents_std), compared with the library.
"""

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.decode import main as decode
from cogvideox_torchax.encode import main as encode
from cogvideox_torchax.io.video import read_mp4
from tests.support.cli import assert_bad_input
from tests.support.command_inputs import pipeline_latents
from tests.support.parity import assert_close

WAN = ["--model", "random:wan-tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]


@pytest.fixture(scope="module")
def library():
    return ct.wrap(ct.random_upstream("wan-tiny"), mesh="dp=1,tp=1")


def test_pipeline_latents_decode_with_no_flags(tmp_path, capsys, library):
    z = pipeline_latents((1, 16, 2, 3, 4))
    save_file({"latents": z}, str(tmp_path / "z.safetensors"))
    assert decode([str(tmp_path / "z.safetensors"), *WAN, "-o", str(tmp_path / "v.npy"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "AutoencoderKLWan" and summary["layout"] == "BCTHW"
    assert summary["unscaled_as"] == "denormalized" and summary["video_shape"] == [1, 3, 5, 24, 32]
    # As WanPipeline does before vae.decode: latents * std + mean.
    config = library.config
    std = np.asarray(config.latents_std, np.float32).reshape(1, -1, 1, 1, 1)
    mean = np.asarray(config.latents_mean, np.float32).reshape(1, -1, 1, 1, 1)
    expected = library.decode(torch.from_numpy(z / (1 / std) + mean)).sample.numpy()
    assert_close(np.load(tmp_path / "v.npy"), expected[0], atol=1e-6, label="CLI vs library, fp32")
    # --no-unscale: the file already holds what vae.decode takes.
    save_file({"latents": z / (1 / std) + mean}, str(tmp_path / "d.safetensors"))
    assert decode([str(tmp_path / "d.safetensors"), *WAN, "-o", str(tmp_path / "d.npy"), "--no-unscale", "-q"]) == 0
    assert_close(np.load(tmp_path / "d.npy"), expected[0], atol=1e-6, label="--no-unscale")


def test_encode_then_decode_round_trips_at_the_family_s_rates(tmp_path, capsys):
    # 11 frames of 40x56: Wan keeps 4k+1 = 9 frames and multiples of 8.
    frames = (np.random.default_rng(1).random((11, 40, 56, 3)) * 255).astype(np.uint8)
    folder = tmp_path / "frames"
    folder.mkdir()
    from PIL import Image

    for i, f in enumerate(frames):
        Image.fromarray(f).save(folder / f"{i:03d}.png")
    assert encode([str(folder), *WAN, "-o", str(tmp_path / "z.safetensors"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["latents_shape"] == [1, 16, 3, 5, 7] and summary["layout"] == "BCTHW"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "z.safetensors"), "np") as f:
        assert f.metadata()["model"] == "AutoencoderKLWan" and "latents_mean" in f.metadata()
    assert decode([str(tmp_path / "z.safetensors"), *WAN, "-o", str(tmp_path / "back.mp4"), "-q"]) == 0
    back, fps = read_mp4(tmp_path / "back.mp4")
    assert back.shape == (9, 40, 56, 3) and fps == 16  # Wan's own frame rate by default


def test_another_family_s_latents_are_refused_by_their_metadata_and_layout(tmp_path, capsys):
    z = pipeline_latents((1, 16, 2, 3, 4))
    save_file({"latents": z}, str(tmp_path / "cog.safetensors"), metadata={"layout": "BTCHW", "scaling_factor": "0.7"})
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "cog.safetensors"), *WAN, "-o", str(tmp_path / "o.npy")],
                     r"metadata \('scaling_factor'\) says these are CogVideoX latents; the model is Wan's")
    save_file({"latents": z}, str(tmp_path / "m.safetensors"), metadata={"model": "AutoencoderKLCogVideoX"})
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "m.safetensors"), *WAN, "-o", str(tmp_path / "o.npy")],
                     r"metadata \('model': 'AutoencoderKLCogVideoX'\) says these are CogVideoX latents")
    # CogVideoX's pipeline layout, (B, T, C, H, W): refused unless asked for.
    save_file({"latents": z.transpose(0, 2, 1, 3, 4).copy()}, str(tmp_path / "t.safetensors"))
    argv = [str(tmp_path / "t.safetensors"), *WAN, "-o", str(tmp_path / "o.npy")]
    assert_bad_input(decode, tmp_path, capsys, argv, r"channels in dim 2, \(B, T, C, H, W\), as CogVideoX's pipelines")
    assert decode([*argv, "--layout", "BTCHW", "-q"]) == 0
    # And Wan's latents given to a CogVideoX model.
    save_file({"latents": z}, str(tmp_path / "w.safetensors"), metadata={"model": "AutoencoderKLWan"})
    cog = ["--model", "random:cogvideox-2b", "--no-compile-cache", "-o", str(tmp_path / "c.npy")]
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "w.safetensors"), *cog],
                     "says these are Wan latents; the model is CogVideoX's")


def test_a_frame_count_wan_does_not_read_is_refused(tmp_path, capsys):
    video = tmp_path / "v"
    video.mkdir()
    from PIL import Image

    for i in range(8):
        Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(video / f"{i}.png")
    assert_bad_input(encode, tmp_path, capsys, [str(video), *WAN, "--frames", "7", "-o", str(tmp_path / "z.safetensors")],
                     r"--frames 7: Wan's encode reads the first frame, then 4 at a time, so only 5 of them")


def test_many_latents_and_dry_runs_on_named_targets(tmp_path, capsys):
    for i, t in enumerate((1, 2, 2)):
        save_file({"latents": pipeline_latents((1, 16, t, 2, 3), seed=i)}, str(tmp_path / f"z{i}.safetensors"))
    out = tmp_path / "out"
    assert decode([str(tmp_path), *WAN, "--output-dir", str(out), "--format", "npy", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["z0.npy", "z1.npy", "z2.npy"]
    assert np.load(out / "z1.npy").shape == (3, 5, 16, 24) and len(summary["memory_plans"]) == 2
    for target in ("h200", "v6e-1"):
        argv = [str(tmp_path / "z1.safetensors"), *WAN[:2], "--dtype", "bf16", "--dry-run", "--target", target,
                "--no-compile-cache", "--json"]
        assert decode(argv) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["dry_run"] and plan["model"] == "AutoencoderKLWan" and plan["memory_plan"]["bytes"] > 0
        assert plan["memory_plan"]["target"] == target


def test_a_budget_nothing_fits_is_exit_3_with_the_plans_figures(tmp_path, capsys):
    save_file({"latents": pipeline_latents((1, 16, 2, 2, 3))}, str(tmp_path / "z.safetensors"))
    assert decode([str(tmp_path / "z.safetensors"), *WAN, "-o", str(tmp_path / "o.npy"), "--max-memory", "4KiB"]) == 3
    err = capsys.readouterr().err
    assert "no plan for the decode of (1, 16, 2, 2, 3) fits" in err and "whole" in err
    assert not (tmp_path / "o.npy").exists()
