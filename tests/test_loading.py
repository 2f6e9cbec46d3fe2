"""from_pretrained / wrap: folders, shards, hub cache, and errors that name the problem."""

import json
import os
import subprocess
import sys

import jax
import pytest
import torch
from safetensors.torch import load_file, save_file

import cogvideox_torchax as ct
from cogvideox_torchax.io import model_files
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode

Z = torch.randn((1, 4, 2, 3, 4), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def tiny_upstream():
    """This module's own tiny VAE (the session one's seed and weights).

    `save_pretrained` writes `_class_name` and `_diffusers_version` into the
    module's config; saving the session fixture would change its config
    under every later test that compares configs.
    """
    return ct.random_upstream("tiny", seed=0)


@pytest.fixture(scope="module")
def saved(tiny_upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_vae")
    tiny_upstream.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def expected(tiny_upstream):
    return upstream_decode(tiny_upstream, Z)


def test_save_pretrained_round_trip(saved, expected):
    vae = ct.from_pretrained(saved, mesh="dp=1,tp=1")
    assert_close(vae.decode(Z).sample, expected, atol=2e-5, label="round trip")


def test_sharded_checkpoint_and_subfolder(tiny_upstream, tmp_path, expected):
    tiny_upstream.save_pretrained(tmp_path / "vae", max_shard_size="20KB")
    shards = list((tmp_path / "vae").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "vae" / model_files.WEIGHTS_INDEX_NAME).is_file()
    vae = ct.from_pretrained(tmp_path, subfolder="vae", mesh="dp=1,tp=1")
    assert_close(vae.decode(Z).sample, expected, atol=2e-5, label="sharded")


def test_bfloat16_load_casts_weights(saved):
    vae = ct.from_pretrained(saved, dtype="bf16", mesh="dp=1,tp=1")
    assert vae.dtype == torch.bfloat16
    assert {w.dtype for w in vae.weights.values()} == {jax.numpy.dtype("bfloat16")}
    assert vae.decode(Z).sample.dtype == torch.bfloat16


def _copy_with(saved, tmp_path, edit):
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    state = load_file(saved / model_files.WEIGHTS_NAME)
    edit(state)
    save_file(state, tmp_path / model_files.WEIGHTS_NAME)
    return tmp_path


def test_wrong_key_is_named(saved, tmp_path):
    key = "decoder.conv_in.conv.weight"

    def rename(state):
        state["decoder.conv_in.conv.weights"] = state.pop(key)

    with pytest.raises(ct.ModelLoadError, match=f"missing key '{key}'"):
        ct.from_pretrained(_copy_with(saved, tmp_path, rename))


def test_unexpected_key_is_named(saved, tmp_path):
    def add(state):
        state["decoder.extra.bias"] = torch.zeros(3)

    with pytest.raises(ct.ModelLoadError, match="unexpected key 'decoder.extra.bias'"):
        ct.from_pretrained(_copy_with(saved, tmp_path, add))


def test_wrong_shape_is_named(saved, tmp_path):
    key = "decoder.norm_out.norm_layer.weight"

    def reshape(state):
        state[key] = torch.zeros(5)

    with pytest.raises(ct.ModelLoadError, match=rf"'{key}' has shape \(5,\), the model expects \(8,\)"):
        ct.from_pretrained(_copy_with(saved, tmp_path, reshape))


def test_folder_errors(saved, tmp_path):
    with pytest.raises(ct.ModelLoadError, match="no such model folder"):
        ct.from_pretrained(tmp_path / "nope")
    with pytest.raises(ct.ModelLoadError, match="no config.json"):
        ct.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(ct.ModelLoadError, match="no safetensors weights"):
        ct.from_pretrained(tmp_path)
    (tmp_path / model_files.WEIGHTS_NAME).write_bytes(b"not safetensors")
    with pytest.raises(ct.ModelLoadError, match="cannot read weights"):
        ct.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL"}))
    with pytest.raises(ct.ModelLoadError, match="not an AutoencoderKLCogVideoX"):
        ct.from_pretrained(tmp_path)


def test_wrap_leaves_the_module_alone(tiny_upstream, expected):
    before = {k: v.clone() for k, v in tiny_upstream.state_dict().items()}
    classes = [type(m) for m in tiny_upstream.modules()]
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    assert [type(m) for m in tiny_upstream.modules()] == classes
    assert all(torch.equal(before[k], v) for k, v in tiny_upstream.state_dict().items())
    assert vae.dtype == torch.float32
    with pytest.raises(TypeError, match="AutoencoderKLCogVideoX"):
        ct.wrap(torch.nn.Linear(2, 2))


def test_mesh_and_dtype_errors(tiny_upstream):
    with pytest.raises(ValueError, match=r"needs 64 devices but only 1"):
        ct.wrap(tiny_upstream, mesh="dp=8,tp=8")
    with pytest.raises(ValueError, match="dp=2,tp=4"):
        ct.wrap(tiny_upstream, mesh="tp:4")
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        ct.wrap(tiny_upstream, dtype="float64")
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        ct.wrap(tiny_upstream, dtype=torch.int8)
    mesh = ct.make_mesh(None)
    assert dict(mesh.shape) == {"dp": 1, "tp": len(jax.devices())}


_HUB_SCRIPT = """
import sys, cogvideox_torchax as ct
try:
    vae = ct.from_pretrained("acme/tiny-cogvideox", subfolder="vae", mesh="dp=1,tp=1")
    print("LOADED", vae.config.latent_channels)
except ct.ModelLoadError as e:
    print("ERROR", e)
"""


def _fake_hub_cache(root, saved):
    repo = root / "models--acme--tiny-cogvideox"
    snapshot = repo / "snapshots" / ("0" * 40) / "vae"
    snapshot.mkdir(parents=True)
    for name in ("config.json", model_files.WEIGHTS_NAME):
        (snapshot / name).write_bytes((saved / name).read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


def _run_offline(cache):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", _HUB_SCRIPT], env=env, capture_output=True, text=True, timeout=300)


def test_hub_id_from_the_offline_cache(saved, tmp_path):
    _fake_hub_cache(tmp_path, saved)
    out = _run_offline(tmp_path)
    assert "LOADED 4" in out.stdout, out.stdout + out.stderr


def test_hub_id_offline_and_not_cached_says_what_to_do(tmp_path):
    out = _run_offline(tmp_path)
    assert "ERROR" in out.stdout and "local diffusers folder" in out.stdout, out.stdout + out.stderr


# -- every config value checked, shards inside the folder, only finite float weights --


@pytest.mark.parametrize(
    "key,value",
    [
        ("norm_num_groups", 0),  # was ZeroDivisionError
        ("block_out_channels", []),  # was IndexError
        ("temporal_compression_ratio", 0),  # was OverflowError
        ("scaling_factor", 0),  # loaded, then divided the latents by 0
        ("scaling_factor", float("nan")),
        ("latent_channels", True),
        ("layers_per_block", -1),
        ("in_channels", 2**40),
        ("block_out_channels", [8, 8, 8, 7]),  # not divisible by norm_num_groups 2
        ("up_block_types", ["CogVideoXUpBlock3D"]),
        ("temporal_compression_ratio", -2),  # upstream's constructor fails on its log2 too
        ("act_fn", "tanh-ish"),
        ("norm_eps", -1e-6),
        ("use_quant_conv", "yes"),
    ],
)
def test_bad_config_value_is_named(saved, tmp_path, key, value):
    config = json.loads((saved / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / model_files.WEIGHTS_NAME).symlink_to(saved / model_files.WEIGHTS_NAME)
    with pytest.raises(ct.ModelLoadError, match=f"'{key}' is"):
        ct.from_pretrained(tmp_path)
    with pytest.raises(ct.ModelLoadError, match=f"'{key}' is"):
        ct.build(config, {})


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_index_shard_outside_the_folder_is_refused(saved, tmp_path, where):
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((saved / model_files.WEIGHTS_NAME).read_bytes())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((saved / "config.json").read_text())
    name = str(outside) if where == "absolute" else "../outside.safetensors"
    keys = load_file(saved / model_files.WEIGHTS_NAME).keys()
    (model / model_files.WEIGHTS_INDEX_NAME).write_text(json.dumps({"weight_map": dict.fromkeys(keys, name)}))
    with pytest.raises(ct.ModelLoadError, match="names a shard outside the model folder"):
        ct.from_pretrained(model)


def test_non_float_weights_are_refused(saved, tmp_path):
    key = "decoder.conv_in.conv.bias"

    def to_int(state):
        state[key] = state[key].to(torch.int32)

    with pytest.raises(ct.ModelLoadError, match=f"weight '{key}' .* is torch.int32; only float"):
        ct.from_pretrained(_copy_with(saved, tmp_path, to_int))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(saved, tmp_path, value):
    key = "decoder.conv_out.conv.weight"

    def poison(state):
        state[key].view(-1)[3] = value

    with pytest.raises(ct.ModelLoadError, match=f"weight '{key}' holds NaN or Inf"):
        ct.from_pretrained(_copy_with(saved, tmp_path, poison))


# -- what loading costs: each weight checked and converted once, nothing of the module copied but its structure --


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_agrees_with_torch_without_calling_it(dtype, monkeypatch):
    cases = [torch.randn(6, 5).to(dtype), torch.tensor([65504.0, -65504.0, 6e-8, 0.0]).to(dtype),
             torch.zeros(0, dtype=dtype)]
    for value in (float("nan"), float("inf"), float("-inf")):
        poisoned = torch.randn(6, 5).to(dtype)
        poisoned[4, 1] = value
        cases += [poisoned, poisoned.t()]  # and not contiguous
    expected = [bool(torch.isfinite(c).all()) for c in cases]

    def slow(*a, **k):
        raise AssertionError("torch.isfinite: several passes over every weight")

    monkeypatch.setattr(torch, "isfinite", slow)
    assert [model_files.all_finite(c) for c in cases] == expected == [True] * 3 + [False] * 6


def test_each_weight_is_converted_once_and_the_module_copied_as_structure_only(tiny_upstream, monkeypatch):
    from cogvideox_torchax.vae import program_cache

    converted = []

    def counted(x, np_dtype):
        converted.append(x)
        return to_numpy(x, np_dtype)

    to_numpy = program_cache.to_numpy
    monkeypatch.setattr(program_cache, "to_numpy", counted)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    state = tiny_upstream.state_dict()
    assert len(converted) == len(state)
    assert sorted(t.data_ptr() for t in converted) == sorted(t.data_ptr() for t in state.values())
    # The patched twin and its unpatched copy hold no weights (meta), whatever the module wrapped held.
    for module in (vae.module, vae.programs._pristine):
        assert {p.device.type for p in module.parameters()} == {"meta"}


def test_bfloat16_weights_for_a_bfloat16_run_are_read_not_converted():
    import numpy as np

    from cogvideox_torchax.vae.program_cache import to_numpy

    t = torch.randn(3, 4).to(torch.bfloat16)
    got = to_numpy(t.t(), np.dtype(jax.numpy.bfloat16))
    assert np.shares_memory(got, t.view(torch.int16).numpy())  # the tensor's own bits
    assert (got.astype(np.float32) == t.t().float().numpy()).all()
