"""The wrapped HunyuanVideo 1.0 and 1.5 VAEs' `save_pretrained`: upstream's format, loaded back by both alike."""

import json

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo, AutoencoderKLHunyuanVideo15

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.hunyuan.conftest import upstream15_of, upstream_of
from tests.support.parity import assert_close


@pytest.mark.parametrize(("preset", "build", "cls", "family"), [
    ("hunyuanvideo-tiny", upstream_of, AutoencoderKLHunyuanVideo, "hunyuan"),
    ("hunyuanvideo15-tiny", upstream15_of, AutoencoderKLHunyuanVideo15, "hunyuan15"),
])
def test_saved_vae_loads_in_upstream_and_ours_and_decodes_alike(tmp_path, preset, build, cls, family):
    original = build({**preset_config(preset), "scaling_factor": 0.7}, seed=5)
    ours = ct.wrap(original, mesh="dp=1,tp=1")
    ours.save_pretrained(tmp_path / "vae")
    files = sorted(p.name for p in (tmp_path / "vae").iterdir())
    assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    config = json.loads((tmp_path / "vae" / "config.json").read_text())
    assert config["_class_name"] == cls.__name__ and config["scaling_factor"] == 0.7
    upstream = cls.from_pretrained(tmp_path / "vae").eval()
    for k, v in original.state_dict().items():  # fp32 weights, the norms off their init, bit for bit
        assert torch.equal(upstream.state_dict()[k], v), k
    again = ct.from_pretrained(tmp_path / "vae", mesh="dp=1,tp=1")
    assert again.family.name == family
    # Six latent frames: 1.0's two windows.
    z = torch.randn((1, 4, 6, 2, 3), generator=torch.Generator().manual_seed(0))
    got = again.decode(z).sample
    assert_close(got, ours.decode(z).sample, atol=0.0, label=f"{preset} reloaded vs before saving")
    with torch.no_grad():
        assert_close(got, upstream.decode(z).sample, atol=1e-4, label=f"{preset} reloaded vs upstream's reloaded")
