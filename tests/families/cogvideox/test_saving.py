"""The wrapped CogVideoX VAE's `save_pretrained`: upstream's format, loaded back by upstream and by us (tiny config)."""

import json

import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX

import cogvideox_torchax as ct
from tests.support.parity import assert_close


def test_saved_vae_loads_in_upstream_and_ours_and_decodes_identically(tiny_upstream, tiny_vae, tmp_path):
    tiny_vae.save_pretrained(tmp_path / "vae")
    assert sorted(p.name for p in (tmp_path / "vae").iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    config = json.loads((tmp_path / "vae" / "config.json").read_text())
    assert config["_class_name"] == "AutoencoderKLCogVideoX" and config["latent_channels"] == 4
    upstream = AutoencoderKLCogVideoX.from_pretrained(tmp_path / "vae")
    original = tiny_upstream.state_dict()
    loaded = upstream.state_dict()
    assert loaded.keys() == original.keys()
    for k, v in original.items():  # fp32 weights round-trip bit for bit
        assert torch.equal(loaded[k], v), k
    z = np.random.default_rng(0).standard_normal((1, 4, 3, 4, 6)).astype(np.float32)
    again = ct.from_pretrained(tmp_path / "vae", mesh="dp=1,tp=1")
    assert_close(again.decode(z).sample.numpy(), tiny_vae.decode(z).sample.numpy(), atol=0.0, label="reloaded")
