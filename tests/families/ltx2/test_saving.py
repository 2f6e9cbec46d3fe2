"""The wrapped LTX-2 and LTX-Video VAEs' `save_pretrained`: upstream's format, statistics kept, loaded back by both."""

import json

import numpy as np
import torch
from diffusers import AutoencoderKLLTX2Video

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.ltx2.conftest import upstream_of
from tests.support.parity import assert_close


def test_saved_vae_loads_in_upstream_and_ours_and_decodes_alike(tmp_path):
    original = upstream_of({**preset_config("ltx2-tiny"), "scaling_factor": 0.7}, seed=5)
    ours = ct.wrap(original, mesh="dp=1,tp=1")
    ours.save_pretrained(tmp_path / "vae")
    files = sorted(p.name for p in (tmp_path / "vae").iterdir())
    assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    config = json.loads((tmp_path / "vae" / "config.json").read_text())
    assert config["_class_name"] == "AutoencoderKLLTX2Video" and config["scaling_factor"] == 0.7
    assert config["decoder_spatial_padding_mode"] == "reflect" and config["latent_channels"] == 8
    upstream = AutoencoderKLLTX2Video.from_pretrained(tmp_path / "vae").eval()
    saved, loaded = original.state_dict(), upstream.state_dict()
    assert loaded.keys() == saved.keys()
    for k, v in saved.items():  # fp32 weights and the latents statistics round-trip bit for bit
        assert torch.equal(loaded[k], v), k
    assert float(loaded["latents_std"].std()) > 0.1  # the statistics off their init, as saved
    # Ours reloaded: the same programs on the same weights (tolerance 0), and upstream's decode (fp32: 1.6e-6 measured).
    again = ct.from_pretrained(tmp_path / "vae", mesh="dp=1,tp=1")
    assert again.family.name == "ltx2"
    np.testing.assert_array_equal(again.latents_std, original.latents_std.numpy())  # the pipelines' host copies
    z = torch.randn((1, 8, 2, 3, 2), generator=torch.Generator().manual_seed(0))
    got = again.decode(z).sample
    assert_close(got, ours.decode(z).sample, atol=0.0, label="reloaded vs before saving")
    with torch.no_grad():
        assert_close(got, upstream.decode(z).sample, atol=1e-4, label="reloaded vs upstream's reloaded")


def test_ltx_video_saved_and_loaded_back_by_upstream_and_ours(tmp_path):
    from diffusers import AutoencoderKLLTXVideo

    original = upstream_of({**preset_config("ltx-tiny"), "scaling_factor": 0.7}, seed=5)
    ours = ct.wrap(original, mesh="dp=1,tp=1")
    ours.save_pretrained(tmp_path / "vae")
    config = json.loads((tmp_path / "vae" / "config.json").read_text())
    assert config["_class_name"] == "AutoencoderKLLTXVideo" and config["decoder_inject_noise"] == [True] * 3 + [False]
    upstream = AutoencoderKLLTXVideo.from_pretrained(tmp_path / "vae").eval()
    for k, v in original.state_dict().items():  # the noise scales and statistics too, bit for bit
        assert torch.equal(upstream.state_dict()[k], v), k
    again = ct.from_pretrained(tmp_path / "vae", mesh="dp=1,tp=1")
    assert again.family.name == "ltx-video"
    z, temb = torch.randn((1, 8, 2, 3, 2), generator=torch.Generator().manual_seed(0)), torch.tensor([0.1])
    torch.manual_seed(1)
    got = again.decode(z, temb).sample
    torch.manual_seed(1)
    with torch.no_grad():
        expected = upstream.decode(z, temb).sample
    assert_close(got, expected, atol=1e-4, label="LTX-Video reloaded vs upstream's reloaded, same draws")
