"""The decode and encode commands on LTX-2: the pipeline's latents with no flags, round trips, LTX-2's refusals.

In-process runs of ``main`` on the ltx2-tiny preset (8 latent channels,
upstream's initial statistics: mean 0, std 1, scaling factor 1) and on a
saved folder whose statistics and scaling factor are not the identity (a
timestep-conditioned decoder, so the commands' decode timestep shows too),
compared with upstream's eager decode on the CPU.
"""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from cogvideox_torchax.config import preset_config
from cogvideox_torchax.decode import main as decode
from cogvideox_torchax.encode import main as encode
from cogvideox_torchax.io.video import read_mp4
from tests.families.ltx2.conftest import CONDITIONED, upstream_of
from tests.support.cli import assert_bad_input
from tests.support.command_inputs import frames_folder, pipeline_latents
from tests.support.parity import assert_close

LTX2 = ["--model", "random:ltx2-tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]
# The saved model's scaling factor (LTX-2's releases use 1.0: this one must show).
SCALING = 0.7


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved LTX-2 VAE: timestep-conditioned, latents_mean / latents_std off (0, 1), scaling factor 0.7."""
    upstream = upstream_of({**CONDITIONED, "scaling_factor": SCALING}, seed=2)
    assert float(upstream.latents_std.std()) > 0.1 and float(upstream.latents_mean.abs().max()) > 0.05
    folder = tmp_path_factory.mktemp("ltx2") / "vae"
    upstream.save_pretrained(folder)
    return upstream, folder


def _denormalized(upstream, z):
    # As LTX2Pipeline._denormalize_latents: latents * std / scaling_factor + mean.
    std = upstream.latents_std.numpy().reshape(1, -1, 1, 1, 1)
    mean = upstream.latents_mean.numpy().reshape(1, -1, 1, 1, 1)
    return (z * std / upstream.config.scaling_factor + mean).astype(np.float32)


def _upstream_decode(upstream, z):
    # LTX2Pipeline's decode: the decode timestep (0 unless set) for a conditioned decoder, else none.
    temb = torch.zeros(z.shape[0]) if upstream.config.timestep_conditioning else None
    with torch.no_grad():
        return upstream.decode(torch.from_numpy(z), temb).sample.numpy()


def test_pipeline_latents_decode_with_no_flags(saved, tmp_path, capsys):
    upstream, folder = saved
    model = ["--model", str(folder), "--mesh", "dp=1,tp=1", "--no-compile-cache"]
    z = pipeline_latents((1, 8, 2, 3, 4))
    save_file({"latents": z}, str(tmp_path / "z.safetensors"))
    assert decode([str(tmp_path / "z.safetensors"), *model, "-o", str(tmp_path / "v.npy"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "AutoencoderKLLTX2Video" and summary["layout"] == "BCTHW"
    assert summary["unscaled_as"] == "denormalized" and summary["video_shape"] == [1, 3, 9, 24, 32]
    expected = _upstream_decode(upstream, _denormalized(upstream, z))
    # fp32 against upstream's eager decode: 1.1e-6 measured.
    assert_close(np.load(tmp_path / "v.npy"), expected[0], atol=1e-4, label="CLI vs upstream, fp32")
    # The statistics matter: decoding the file as vae.decode takes it is another video.
    assert np.abs(_upstream_decode(upstream, z) - expected).max() > 1e-2
    # --no-unscale: the file already holds what vae.decode takes.
    save_file({"latents": _denormalized(upstream, z)}, str(tmp_path / "d.safetensors"))
    assert decode([str(tmp_path / "d.safetensors"), *model, "-o", str(tmp_path / "d.npy"), "--no-unscale", "-q"]) == 0
    assert_close(np.load(tmp_path / "d.npy"), expected[0], atol=1e-4, label="--no-unscale")


def test_encode_then_decode_round_trips_at_8k_plus_1_frames(saved, tmp_path, capsys):
    upstream, folder = saved
    model = ["--model", str(folder), "--mesh", "dp=1,tp=1", "--no-compile-cache"]
    # 19 frames of 24x44: LTX-2 keeps 8k+1 = 17 frames and multiples of 8 (24x40).
    frames = frames_folder(tmp_path / "frames", 19, (24, 44))
    assert encode([str(tmp_path / "frames"), *model, "-o", str(tmp_path / "z.safetensors"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["latents_shape"] == [1, 8, 3, 3, 5] and summary["video_shape"] == [1, 3, 17, 24, 40]
    assert summary["scaling_factor"] == SCALING
    with safe_open(str(tmp_path / "z.safetensors"), "np") as f:
        meta, held = f.metadata(), f.get_tensor(next(iter(f.keys())))
    assert meta["model"] == "AutoencoderKLLTX2Video" and meta["layout"] == "BCTHW"
    assert json.loads(meta["latents_std"]) == pytest.approx(upstream.latents_std.tolist())
    assert float(meta["scaling_factor"]) == SCALING
    # As LTX2ImageToVideoPipeline holds encoded latents: (mode - mean) * scaling_factor / std.
    x = torch.from_numpy(frames[:17, :, 2:42].astype(np.float32) / 255 * 2 - 1).permute(3, 0, 1, 2)[None]
    with torch.no_grad():
        mode = upstream.encode(x).latent_dist.mode()
    mean, std = upstream.latents_mean.view(1, -1, 1, 1, 1), upstream.latents_std.view(1, -1, 1, 1, 1)
    # fp32: 6.9e-7 measured.
    assert_close(held, ((mode - mean) * SCALING / std).numpy(), atol=1e-4, label="encoded latents vs upstream")
    # Read back with no flags: 17 frames at LTX-2's 24 fps.
    assert decode([str(tmp_path / "z.safetensors"), *model, "-o", str(tmp_path / "back.mp4"), "-q"]) == 0
    back, fps = read_mp4(tmp_path / "back.mp4")
    assert back.shape == (17, 24, 40, 3) and fps == 24


def test_another_family_s_latents_are_refused_naming_the_channels(tmp_path, capsys):
    # Wan's 16 channels (no metadata): the message names LTX-2's 8 (the tiny preset's).
    wan = pipeline_latents((1, 16, 2, 3, 4))
    save_file({"latents": wan}, str(tmp_path / "w.safetensors"))
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "w.safetensors"), *LTX2, "-o", str(tmp_path / "o.npy")],
                     r"latents shape \(1, 16, 2, 3, 4\) has no dimension with the model's 8 channels")
    # By the same rule, the released config's count: 128.
    from cogvideox_torchax import families
    from cogvideox_torchax.io import family_latents
    from cogvideox_torchax.io.latents import LatentsError

    ltx2 = families.FAMILIES["ltx2"]
    with pytest.raises(LatentsError, match="with the model's 128 channels"):
        family_latents._layout(ltx2, wan.shape, ltx2.latent_channels(preset_config("ltx2")), "auto")
    # Metadata naming another family is refused before the channels are looked at.
    save_file({"latents": pipeline_latents((1, 8, 2, 3, 4))}, str(tmp_path / "m.safetensors"),
              metadata={"model": "AutoencoderKLWan"})
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "m.safetensors"), *LTX2, "-o", str(tmp_path / "o.npy")],
                     r"metadata \('model': 'AutoencoderKLWan'\) says these are Wan latents; the model is LTX-2's")
    # And LTX-2's latents given to a Wan model.
    save_file({"latents": pipeline_latents((1, 16, 2, 3, 4))}, str(tmp_path / "l.safetensors"),
              metadata={"model": "AutoencoderKLLTX2Video"})
    wan_model = ["--model", "random:wan-tiny", "--mesh", "dp=1,tp=1", "-o", str(tmp_path / "o.npy")]
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "l.safetensors"), *wan_model],
                     "says these are LTX-2 latents; the model is Wan's")


def test_a_frame_count_ltx2_does_not_read_is_refused(tmp_path, capsys):
    frames_folder(tmp_path / "v", 12, (16, 16))
    argv = [str(tmp_path / "v"), *LTX2, "--frames", "10", "-o", str(tmp_path / "z.safetensors")]
    assert_bad_input(encode, tmp_path, capsys, argv,
                     r"--frames 10: LTX-2's encode reads the first frame, then 8 at a time, so only 9 of them; "
                     r"ask for 9 or 17 \(8k\+1 frames")


def test_many_latents_stream_to_mp4_and_a_dry_run(tmp_path, capsys):
    for i, t in enumerate((1, 2, 2)):
        save_file({"latents": pipeline_latents((1, 8, t, 2, 3), seed=i)}, str(tmp_path / f"z{i}.safetensors"))
    out = tmp_path / "out"
    assert decode([str(tmp_path), *LTX2, "--output-dir", str(out), "--format", "npy", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["z0.npy", "z1.npy", "z2.npy"]
    assert np.load(out / "z1.npy").shape == (3, 9, 16, 24) and len(summary["memory_plans"]) == 2
    # One mp4, streamed (one chunk: LTX-2 decodes the whole video in one call), at 24 fps.
    assert decode([str(tmp_path / "z2.safetensors"), *LTX2, "-o", str(tmp_path / "v.mp4"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["streamed"] and summary["stream_why_not"] is None
    assert summary["memory_plan"]["name"] == "streamed"
    back, fps = read_mp4(tmp_path / "v.mp4")
    assert back.shape == (9, 16, 24, 3) and fps == 24
    # A dry run plans an accelerator's memory and writes nothing.
    before = sorted(tmp_path.rglob("*"))
    argv = [str(tmp_path / "z1.safetensors"), *LTX2[:2], "--dtype", "bf16", "--dry-run", "--target", "h200",
            "--no-compile-cache", "--json"]
    assert decode(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dry_run"] and plan["model"] == "AutoencoderKLLTX2Video" and plan["memory_plan"]["bytes"] > 0
    assert plan["memory_plan"]["target"] == "h200" and sorted(tmp_path.rglob("*")) == before


def test_decode_stream_yields_the_whole_video_in_one_chunk(ltx2_tiny):
    # fp32 on the CPU: the stream's one chunk is the whole decode, bit for bit (tolerance 0).
    z = pipeline_latents((1, 8, 3, 2, 2), seed=4)
    chunks = list(ltx2_tiny.decode_stream(z, output="video"))
    assert [(c.start, c.frames, c.data.shape) for c in chunks] == [(0, 17, (1, 3, 17, 16, 16))]
    np.testing.assert_array_equal(chunks[0].data, np.asarray(ltx2_tiny.decode_jax(z)))


@pytest.fixture(scope="module")
def saved_ltx_video(tmp_path_factory):
    """A saved LTX-Video 0.9.1-style VAE: conditioned, injecting noise, statistics off (0, 1), scaling factor 0.7."""
    upstream = upstream_of({**preset_config("ltx-tiny"), "scaling_factor": SCALING}, seed=3)
    folder = tmp_path_factory.mktemp("ltx-video") / "vae"
    upstream.save_pretrained(folder)
    return upstream, folder


def test_ltx_video_pipeline_latents_decode_with_no_flags_the_same_on_every_run(saved_ltx_video, tmp_path, capsys):
    upstream, folder = saved_ltx_video
    model = ["--model", str(folder), "--mesh", "dp=1,tp=1", "--no-compile-cache"]
    for i, t in enumerate((2, 2)):
        save_file({"latents": pipeline_latents((1, 8, t, 3, 4), seed=i)}, str(tmp_path / f"z{i}.safetensors"))
    assert decode([str(tmp_path / "z0.safetensors"), *model, "-o", str(tmp_path / "v.npy"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "AutoencoderKLLTXVideo" and summary["video_shape"] == [1, 3, 9, 24, 32]
    # As LTXPipeline decodes them: denormalised, at decode timestep 0; the noise upstream draws after
    # torch.manual_seed(0), as the commands draw it for each decode.
    z = _denormalized(upstream, pipeline_latents((1, 8, 2, 3, 4), seed=0))
    torch.manual_seed(0)
    expected = _upstream_decode(upstream, z)
    # fp32 against upstream's eager decode: 1.2e-6 measured.
    assert_close(np.load(tmp_path / "v.npy"), expected[0], atol=1e-4, label="LTX-Video CLI vs upstream")
    # Again, and beside another file in one batch: the same video (the draws do not depend on the batch).
    out = tmp_path / "many"
    assert decode([str(tmp_path), *model, "--output-dir", str(out), "--format", "npy", "-q"]) == 0
    np.testing.assert_array_equal(np.load(out / "z0.npy"), np.load(tmp_path / "v.npy"))


def test_ltx_video_encode_then_decode_to_mp4_at_25_fps(saved_ltx_video, tmp_path, capsys):
    upstream, folder = saved_ltx_video
    model = ["--model", str(folder), "--mesh", "dp=1,tp=1", "--no-compile-cache"]
    frames_folder(tmp_path / "frames", 10, (16, 24))
    assert encode([str(tmp_path / "frames"), *model, "-o", str(tmp_path / "z.safetensors"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["latents_shape"] == [1, 8, 2, 2, 3] and summary["video_shape"] == [1, 3, 9, 16, 24]
    with safe_open(str(tmp_path / "z.safetensors"), "np") as f:
        assert f.metadata()["model"] == "AutoencoderKLLTXVideo"
    assert decode([str(tmp_path / "z.safetensors"), *model, "-o", str(tmp_path / "back.mp4"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["streamed"]  # one chunk: the whole video in one call, as upstream decodes it
    back, fps = read_mp4(tmp_path / "back.mp4")
    assert back.shape == (9, 16, 24, 3) and fps == 25
