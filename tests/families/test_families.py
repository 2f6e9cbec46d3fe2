"""Model families: detected from the module's class or the config's ``_class_name``; one record each."""

import json

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.config import PRESETS, preset_config
from cogvideox_torchax.io import model_files
from cogvideox_torchax.patches.registry import patches_for


def test_each_family_is_found_by_class_and_by_config(tiny_upstream):
    wan = ct.random_upstream("wan-tiny")
    assert families.of_module(tiny_upstream) is families.get("cogvideox")
    assert families.of_module(wan) is families.get("wan")
    assert families.of_config(dict(wan.config)) is families.get("wan")
    assert families.of_config({}) is families.DEFAULT  # configs saved before the second family
    # A wrapped VAE stands in for its own upstream class.
    vae = ct.wrap(wan, mesh="dp=1,tp=1")
    assert vae.family.name == "wan" and isinstance(vae, type(wan)) and families.of_module(vae) is vae.family


def test_every_preset_names_its_family_and_builds_it():
    assert {"cogvideox-2b", "cogvideox-1.5", "tiny", "wan2.1", "wan2.2-ti2v-5b", "wan-tiny"} <= set(PRESETS)
    for name in PRESETS:
        family = families.of_config(preset_config(name))
        assert name in family.presets
        family.check_config(preset_config(name), source=name)
    with torch.device("meta"):
        big = families.get("wan").upstream.from_config(preset_config("wan2.2-ti2v-5b"))
    assert big.config.z_dim == 48 and big.decoder.conv_in.in_channels == 48


def test_an_unknown_class_is_refused_naming_the_supported_ones(tmp_path):
    with pytest.raises(TypeError, match="AutoencoderKLCogVideoX or AutoencoderKLWan"):
        ct.wrap(torch.nn.Conv2d(3, 3, 1))
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLMochi"}))
    with pytest.raises(ct.ModelLoadError, match="'AutoencoderKLMochi', not an AutoencoderKLCogVideoX or"):
        model_files.read_config(tmp_path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"z_dim": 0}, "'z_dim' is 0; it must be an integer"),
        ({"temperal_downsample": [True, True]}, "upstream's AutoencoderKLWan does not build from it: IndexError"),
        ({"latents_std": [1.0] * 15}, "'latents_std' .* a list of z_dim \\(16\\)"),
        ({"latents_std": [0.0] * 16}, "'latents_std' .* positive numbers"),
        ({"dim_mult": []}, "'dim_mult' is \\[\\]; it must be a non-empty list"),
    ],
)
def test_a_wan_config_we_cannot_run_names_the_field(change, match):
    with pytest.raises(ct.ModelLoadError, match=match):
        model_files.check_config({**preset_config("wan-tiny"), **change}, source="config.json")


@pytest.mark.parametrize("change", [{"temperal_downsample": [False, False, True]}, {"patch_size": 2},
                                    {"scale_factor_spatial": 16}])
def test_a_wan_config_upstream_builds_is_taken(change):
    """Refused before, though upstream builds them: what upstream then does, ours does (wan/test_configs.py)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_files.check_config({**preset_config("wan-tiny"), **change}, source="config.json")


def test_each_family_gets_its_own_patches_and_the_shared_ones():
    wan = {p.switch for p in patches_for("wan")}
    cog = {p.switch for p in patches_for("cogvideox")}
    assert {"wan_frame_scan", "wan_rms_norm", "wan_attention"} <= wan and not wan & {"frame_scan", "time_chunks"}
    assert {"conv_bias", "silu", "nearest_upsample", "shard_activations"} <= wan & cog
    with pytest.raises(ValueError, match="frame_scan=True cannot apply to Wan: it patches CogVideoX"):
        ct.wrap(ct.random_upstream("wan-tiny"), mesh="dp=1,tp=1", options=ct.RuntimeOptions(frame_scan=True))


def test_frame_rules():
    cog, wan = families.get("cogvideox"), families.get("wan")
    config = ct.random_upstream("wan-tiny").config
    assert [wan.frames_of(config, t) for t in (1, 2, 13, 21)] == [1, 5, 49, 81]
    assert [wan.frames_read(config, f) for f in (1, 4, 5, 49, 50, 81)] == [1, 1, 5, 49, 49, 81]
    tiny = preset_config("tiny")  # every released CogVideoX: time compressed 4x, at two resamplers
    assert [cog.frames_read(tiny, f) for f in (1, 4, 50)] == [1, 4, 50]  # CogVideoX reads every frame
    assert [cog.round_trip_frames(tiny, f) for f in (1, 8, 9, 50)] == [1, 1, 9, 49]
    assert [cog.frames_of(tiny, t) for t in (1, 2, 13)] == [1, 8, 49]
    # Another ratio, as upstream's constructors read it: time doubled at the first int(log2(8)) = 3 resamplers.
    assert [cog.frames_of(tiny | {"temporal_compression_ratio": 8}, t) for t in (1, 2, 3)] == [1, 16, 17]
    assert wan.stream_batches(None, 3) == [(0, 1), (1, 2), (2, 3)]


def test_pipeline_latents_round_trip_per_channel():
    import numpy as np

    wan = families.get("wan")
    config = preset_config("wan2.2-ti2v-5b")
    z = np.random.default_rng(0).standard_normal((1, 48, 2, 3, 4)).astype(np.float32)
    held = wan.to_pipeline(z, config)
    # As the pipelines write it: (z - mean) / std, and back z * std + mean.
    mean = np.asarray(config["latents_mean"], np.float32).reshape(1, -1, 1, 1, 1)
    std = np.asarray(config["latents_std"], np.float32).reshape(1, -1, 1, 1, 1)
    np.testing.assert_allclose(held, (z - mean) / std, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(wan.from_pipeline(held, config), z, rtol=1e-5, atol=1e-5)


def test_enable_tiling_shows_its_own_familys_arguments():
    """A Wan VAE's ``enable_tiling`` takes Wan's strides, the class shows CogVideoX's (the default family)."""
    import inspect

    from diffusers import AutoencoderKLCogVideoX, AutoencoderKLWan

    def names(f):
        return [p for p in inspect.signature(f).parameters if p != "self"]

    vae = ct.wrap(ct.random_upstream("wan-tiny"), mesh="dp=1,tp=1")
    assert names(vae.enable_tiling) == names(AutoencoderKLWan.enable_tiling)
    assert names(ct.TorchaxVAE.enable_tiling) == names(AutoencoderKLCogVideoX.enable_tiling)
    vae.enable_tiling(64, 64, 48, 48)  # positionally, as upstream allows
    assert (vae.module.tile_sample_stride_height, vae.module.tile_sample_stride_width) == (48, 48)


def test_a_config_without_its_class_name_is_told_by_its_keys_or_says_which_keys_were_looked_at(tmp_path):
    for preset in families.preset_names():
        config = preset_config(preset)
        family = families.of_config(config)
        config.pop("_class_name", None)
        assert families.of_config(config) is family, preset
    assert families.of_config({}) is families.DEFAULT  # saved before the second family: CogVideoX's
    (tmp_path / "config.json").write_text('{"latent_channels": 4, "not_a_key": 1, "_diffusers_version": "0.42.1"}')
    with pytest.raises(ct.ModelLoadError) as e:
        model_files.read_config(tmp_path)
    assert "no '_class_name'" in str(e.value) and "looked at ['latent_channels', 'not_a_key']" in str(e.value)
    assert "AutoencoderKLWan does not take ['latent_channels', 'not_a_key']" in str(e.value)
