"""The decode and encode commands on HunyuanVideo: the pipeline's latents with no flags, round trips, --untiled,
streaming to mp4, many latents, refusals.

In-process runs of ``main`` on a saved tiny VAE whose scaling factor is not
the release's (it must show), compared with upstream's eager decode on the CPU.
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
from tests.families.hunyuan.conftest import upstream_of
from tests.support.cli import assert_bad_input
from tests.support.command_inputs import frames_folder, pipeline_latents
from tests.support.parity import assert_close

SCALING = 0.7


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    upstream = upstream_of({**preset_config("hunyuanvideo-tiny"), "scaling_factor": SCALING}, seed=2)
    folder = tmp_path_factory.mktemp("hunyuan") / "vae"
    upstream.save_pretrained(folder)
    return upstream, folder


def _model(folder):
    return ["--model", str(folder), "--mesh", "dp=1,tp=1", "--no-compile-cache"]


def _upstream_decode(upstream, z, **settings):
    saved = {k: getattr(upstream, k) for k in settings}
    for k, v in settings.items():
        setattr(upstream, k, v)
    try:
        with torch.no_grad():
            return upstream.decode(torch.from_numpy(z)).sample.numpy()
    finally:
        for k, v in saved.items():
            setattr(upstream, k, v)


def test_pipeline_latents_decode_with_no_flags_and_untiled(saved, tmp_path, capsys):
    upstream, folder = saved
    # Six latent frames: upstream's default decode takes two windows.
    z = pipeline_latents((1, 4, 6, 3, 4))
    save_file({"latents": z}, str(tmp_path / "z.safetensors"))
    assert decode([str(tmp_path / "z.safetensors"), *_model(folder), "-o", str(tmp_path / "v.npy"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "AutoencoderKLHunyuanVideo" and summary["layout"] == "BCTHW"
    assert summary["video_shape"] == [1, 3, 21, 24, 32]
    # As HunyuanVideoPipeline decodes: latents / scaling_factor.
    expected = _upstream_decode(upstream, z / np.float32(SCALING))
    # fp32 against upstream's eager decode.
    assert_close(np.load(tmp_path / "v.npy"), expected[0], atol=1e-4, label="CLI vs upstream, fp32")
    # --untiled: upstream's decoder over the whole video at once, another video.
    argv = [str(tmp_path / "z.safetensors"), *_model(folder), "-o", str(tmp_path / "u.npy"), "--untiled", "-q"]
    assert decode(argv) == 0
    untiled = _upstream_decode(upstream, z / np.float32(SCALING), use_framewise_decoding=False)
    assert_close(np.load(tmp_path / "u.npy"), untiled[0], atol=1e-4, label="CLI --untiled vs upstream")
    assert np.abs(untiled - expected).max() > 1e-3


def test_encode_then_decode_round_trips_to_mp4(saved, tmp_path, capsys):
    upstream, folder = saved
    frames = frames_folder(tmp_path / "frames", 9, (16, 24))
    assert encode([str(tmp_path / "frames"), *_model(folder), "-o", str(tmp_path / "z.safetensors"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["latents_shape"] == [1, 4, 3, 2, 3] and summary["video_shape"] == [1, 3, 9, 16, 24]
    with safe_open(str(tmp_path / "z.safetensors"), "np") as f:
        meta, held = f.metadata(), f.get_tensor(next(iter(f.keys())))
    assert meta["model"] == "AutoencoderKLHunyuanVideo" and float(meta["scaling_factor"]) == SCALING
    # As HunyuanVideoImageToVideoPipeline holds encoded latents: mode * scaling_factor.
    x = torch.from_numpy(frames.astype(np.float32) / 255 * 2 - 1).permute(3, 0, 1, 2)[None]
    with torch.no_grad():
        mode = upstream.encode(x).latent_dist.mode()
    assert_close(held, (mode * SCALING).numpy(), atol=1e-4, label="encoded latents vs upstream")
    capsys.readouterr()
    assert decode([str(tmp_path / "z.safetensors"), *_model(folder), "-o", str(tmp_path / "back.mp4"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["streamed"] and summary["stream_why_not"] is None
    back, fps = read_mp4(tmp_path / "back.mp4")
    assert back.shape == (9, 16, 24, 3) and fps == 15


def test_many_latents_as_one_each(saved, tmp_path):
    _, folder = saved
    for i, t in enumerate((1, 5, 5)):
        save_file({"latents": pipeline_latents((1, 4, t, 2, 3), seed=i)}, str(tmp_path / f"z{i}.safetensors"))
    out = tmp_path / "out"
    assert decode([str(tmp_path), *_model(folder), "--output-dir", str(out), "--format", "npy", "-q"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["z0.npy", "z1.npy", "z2.npy"]
    alone = tmp_path / "alone.npy"
    assert decode([str(tmp_path / "z2.safetensors"), *_model(folder), "-o", str(alone), "-q"]) == 0
    np.testing.assert_array_equal(np.load(out / "z2.npy"), np.load(alone))


def test_wrong_channels_and_untiled_elsewhere_are_refused(tmp_path, capsys):
    tiny = ["--model", "random:hunyuanvideo-tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]
    save_file({"latents": pipeline_latents((1, 16, 2, 3, 4))}, str(tmp_path / "w.safetensors"))
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "w.safetensors"), *tiny, "-o", str(tmp_path / "o.npy")],
                     r"latents shape \(1, 16, 2, 3, 4\) has no dimension with the model's 4 channels")
    save_file({"latents": pipeline_latents((1, 16, 2, 3, 4))}, str(tmp_path / "x.safetensors"))
    wan = ["--model", "random:wan-tiny", "--mesh", "dp=1,tp=1", "--untiled", "-o", str(tmp_path / "o.npy")]
    assert_bad_input(decode, tmp_path, capsys, [str(tmp_path / "x.safetensors"), *wan],
                     "--untiled: Wan's decode and encode have no frame windows to turn off")


def test_hunyuan15_pipeline_latents_decode_with_no_flags_and_round_trip(tmp_path, capsys):
    from tests.families.hunyuan.conftest import upstream15_of

    upstream = upstream15_of({**preset_config("hunyuanvideo15-tiny"), "scaling_factor": SCALING}, seed=3)
    upstream.save_pretrained(tmp_path / "vae15")
    model = _model(tmp_path / "vae15")
    z = pipeline_latents((1, 4, 3, 3, 4), seed=5)
    save_file({"latents": z}, str(tmp_path / "z.safetensors"))
    # --untiled is its default decode already: taken, the same video.
    for flags, out in (([], "v.npy"), (["--untiled"], "u.npy")):
        assert decode([str(tmp_path / "z.safetensors"), *model, "-o", str(tmp_path / out), "-q", *flags]) == 0
    # As HunyuanVideo15Pipeline decodes: latents / scaling_factor, the whole video at once.
    expected = _upstream_decode(upstream, z / np.float32(SCALING))
    assert_close(np.load(tmp_path / "v.npy"), expected[0], atol=1e-4, label="1.5 CLI vs upstream, fp32")
    np.testing.assert_array_equal(np.load(tmp_path / "u.npy"), np.load(tmp_path / "v.npy"))
    # 4k+1 frames do not round-trip at the tiny config's 2x time: 2k+1 frames do; back to mp4 at 24 fps.
    frames_folder(tmp_path / "frames", 5, (8, 12))
    capsys.readouterr()
    assert encode([str(tmp_path / "frames"), *model, "-o", str(tmp_path / "e.safetensors"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latents_shape"] == [1, 4, 3, 2, 3]
    assert decode([str(tmp_path / "e.safetensors"), *model, "-o", str(tmp_path / "back.mp4"), "-q"]) == 0
    back, fps = read_mp4(tmp_path / "back.mp4")
    assert back.shape == (5, 8, 12, 3) and fps == 24
