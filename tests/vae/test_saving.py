"""`TorchaxVAE.save_pretrained` and `from_pretrained`: dtypes, variants, refusals, earlier saves (tiny config, offline).

Each family's round trip through upstream's format: tests/families/<name>/test_saving.py.
"""

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLCogVideoX
from safetensors import safe_open

import cogvideox_torchax as ct
from cogvideox_torchax.io.model_files import with_variant
from tests.support.parity import assert_close


def test_bf16_vae_saves_bf16_unless_told_and_variants_name_the_file(tiny_upstream, tmp_path):
    vae = ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1")
    vae.save_pretrained(tmp_path / "a")
    vae.save_pretrained(tmp_path / "b", variant="fp32", torch_dtype=torch.float32)
    with safe_open(str(tmp_path / "a" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert (tmp_path / "b" / "diffusion_pytorch_model.fp32.safetensors").exists()
    upstream = AutoencoderKLCogVideoX.from_pretrained(tmp_path / "b", variant="fp32")
    w = tiny_upstream.state_dict()["decoder.conv_in.conv.weight"]
    assert torch.equal(upstream.state_dict()["decoder.conv_in.conv.weight"], w.to(torch.bfloat16).float())


def test_pickles_and_files_are_refused_and_nothing_is_left(tiny_vae, tmp_path):
    with pytest.raises(ValueError, match="safetensors only"):
        tiny_vae.save_pretrained(tmp_path / "p", safe_serialization=False)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="is a file"):
        tiny_vae.save_pretrained(tmp_path / "file")
    with pytest.raises(NotImplementedError, match="push_to_hub"):
        tiny_vae.save_pretrained(tmp_path / "h", push_to_hub=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "mine"


def test_the_pipeline_loaders_entry_reads_variants_and_refuses_what_it_cannot_do(tiny_upstream, tmp_path):
    # What diffusers' pipeline loader calls for a saved pipeline naming TorchaxVAE.
    vae = ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1")
    vae.save_pretrained(tmp_path / "v", variant="x")
    vae.save_pretrained(tmp_path / "v")  # a second file: only the variant's name picks it
    loaded = ct.TorchaxVAE.from_pretrained(tmp_path / "v", variant="x", low_cpu_mem_usage=True, device_map=None)
    assert loaded.dtype == torch.bfloat16  # no torch_dtype: the saved dtype
    assert ct.TorchaxVAE.from_pretrained(tmp_path / "v", torch_dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ct.ModelLoadError, match="no weights of variant 'y'"):
        ct.TorchaxVAE.from_pretrained(tmp_path / "v", variant="y")
    with pytest.raises(NotImplementedError, match="device_map"):
        ct.TorchaxVAE.from_pretrained(tmp_path / "v", device_map="auto")


@pytest.mark.parametrize("variant", [None, "fp16"])
def test_a_save_over_an_earlier_sharded_save_loads_as_what_was_saved(tiny_upstream, tiny_vae, tmp_path, variant):
    """Whatever the folder held, it loads as the new save, by upstream and by us; nothing else is removed."""
    folder = tmp_path / "vae"
    other = AutoencoderKLCogVideoX.from_config(tiny_upstream.config)
    torch.manual_seed(1)
    for p in other.parameters():
        p.data.normal_()
    other.save_pretrained(folder, max_shard_size="20KB", variant=variant)  # upstream's shards and index
    (folder / with_variant("diffusion_pytorch_model.bin.index.json", variant)).write_text("{}")  # a pickle save's
    (folder / "diffusion_pytorch_model.bin.index.other.json").write_text("{}")  # another variant's: stays
    (folder / "notes-00001-of-00002.txt").write_text("mine")  # shard-like, not weights
    (folder / "README.md").write_text("mine")
    shards = sorted(p.name for p in folder.glob("*-of-*.safetensors"))
    assert len(shards) > 1
    tiny_vae.save_pretrained(folder, variant=variant)
    left = sorted(p.name for p in folder.iterdir())
    weights = "diffusion_pytorch_model.safetensors" if variant is None else "diffusion_pytorch_model.fp16.safetensors"
    kept = ["README.md", "diffusion_pytorch_model.bin.index.other.json", "notes-00001-of-00002.txt"]
    assert left == sorted([*kept, "config.json", weights]), left
    loaded = AutoencoderKLCogVideoX.from_pretrained(folder, variant=variant).state_dict()
    for k, v in tiny_upstream.state_dict().items():  # exactly what was saved, not the stale shards
        assert torch.equal(loaded[k], v), k
    again = ct.TorchaxVAE.from_pretrained(folder, variant=variant, torch_dtype=torch.float32)
    z = np.random.default_rng(0).standard_normal((1, 4, 3, 4, 6)).astype(np.float32)
    assert_close(again.decode(z).sample.numpy(), tiny_vae.decode(z).sample.numpy(), atol=0.0, label="reloaded")
