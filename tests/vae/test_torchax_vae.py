"""The upstream inference surface on `TorchaxVAE` (`vae.torchax_vae`), and nothing else of upstream's."""

import inspect

import pytest
import torch
from diffusers import AutoencoderKLCogVideoX

import cogvideox_torchax as ct
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode


def _video(shape, seed=1):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("sample_posterior", [False, True])
def test_forward_matches_upstream(tiny_upstream, tiny_vae, sample_posterior):
    x = _video((1, 3, 9, 16, 16))
    with torch.no_grad():
        expected = tiny_upstream(x, sample_posterior=sample_posterior, generator=torch.Generator().manual_seed(3))
    got = tiny_vae(x, sample_posterior=sample_posterior, generator=torch.Generator().manual_seed(3))
    # fp32, encode then decode: measured 3.1e-7 (mode) and 1.1e-6 (sample).
    assert_close(got.sample, expected.sample, atol=1e-4, label=f"forward sample_posterior={sample_posterior}")
    (tup,) = tiny_vae.forward(x, return_dict=False)
    assert tup.shape == expected.sample.shape


def test_slicing_runs_one_element_at_a_time(tiny_upstream):
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    assert not vae.use_slicing
    vae.enable_slicing()
    assert vae.use_slicing
    x, z = _video((2, 3, 5, 8, 8)), torch.randn((2, 4, 2, 2, 2), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected_mode = tiny_upstream.encode(x).latent_dist.mode()
    assert_close(vae.encode(x).latent_dist.mode(), expected_mode, atol=1e-4, label="sliced encode")
    assert_close(vae.decode(z).sample, upstream_decode(tiny_upstream, z), atol=2e-5, label="sliced decode")
    # One program each, compiled for batch 1.
    assert vae.compiled_shapes() == [(1, 4, 2, 2, 2)]
    assert vae.compiled_shapes("encode") == [(1, 3, 5, 8, 8)]
    vae.disable_slicing()
    assert not vae.use_slicing
    vae.decode(z)
    assert (2, 4, 2, 2, 2) in vae.compiled_shapes()


def test_enable_tiling_has_upstreams_signature(tiny_vae):
    ours = inspect.signature(ct.TorchaxVAE.enable_tiling)
    theirs = inspect.signature(AutoencoderKLCogVideoX.enable_tiling)
    assert list(ours.parameters) == list(theirs.parameters)
    vae = ct.wrap(ct.random_upstream("tiny"), mesh="dp=1,tp=1")
    vae.enable_tiling(32, 48, 0.25, 0.2)  # positionally, as upstream allows
    m = vae.module
    assert (m.tile_sample_min_height, m.tile_sample_min_width) == (32, 48)
    assert (m.tile_overlap_factor_height, m.tile_overlap_factor_width) == (0.25, 0.2)
    assert vae.use_tiling
    vae.disable_tiling()
    assert not vae.use_tiling


def test_config_dtype_device_and_to(tiny_upstream):
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    assert vae.config == tiny_upstream.config
    assert vae.dtype == torch.float32
    assert vae.device == torch.device("cpu")
    # As upstream code calls it; each returns the VAE itself.
    assert vae.to("cpu") is vae
    assert vae.to(torch.float32) is vae
    assert vae.to("cpu", torch.float32) is vae
    assert vae.to(device="cpu", dtype=torch.float32) is vae
    assert vae.to(torch.zeros(1)) is vae
    # Another dtype converts the VAE (as a pipeline's .to(dtype) does); one
    # it cannot run is refused naming those it can, and changes nothing.
    assert vae.to(torch.bfloat16) is vae and vae.dtype == torch.bfloat16 and vae.options.dtype == "bfloat16"
    assert vae.half() is vae and vae.dtype == torch.float16
    assert vae.float() is vae and vae.dtype == torch.float32
    with pytest.raises(ValueError, match="cannot run in torch.float64: dtype must be float32"):
        vae.double()
    assert vae.dtype == torch.float32
    # Non-torch inputs come back on `device`; torch inputs on their own device.
    out = vae.decode(torch.zeros((1, 4, 1, 1, 1)).numpy()).sample
    assert isinstance(out, torch.Tensor) and out.device == vae.device


@pytest.mark.parametrize("name", ["load_state_dict", "tiled_encode", "encoder", "parameters", "state_dict", "zero_grad"])
def test_other_upstream_attributes_raise(tiny_vae, name):
    assert hasattr(ct.random_upstream("tiny"), name)
    with pytest.raises(ct.UnsupportedAttributeError, match=f"AutoencoderKLCogVideoX.{name}.*decode, encode"):
        getattr(tiny_vae, name)
    # Both kinds of error, so `hasattr` says no and `except NotImplementedError` works.
    assert not hasattr(tiny_vae, name)
    with pytest.raises(NotImplementedError):
        getattr(tiny_vae, name)


@pytest.mark.parametrize("name", ["latent_channels", "scaling_factor", "block_out_channels", "temporal_compression_ratio"])
def test_deprecated_direct_config_access_works_with_upstreams_warning(tiny_upstream, tiny_vae, name):
    with pytest.warns(FutureWarning, match=rf"Accessing config attribute `{name}` directly via 'AutoencoderKLCogVideoX'"):
        expected = getattr(tiny_upstream, name)
    with pytest.warns(FutureWarning, match=rf"Accessing config attribute `{name}` directly via 'TorchaxVAE'.*config"):
        assert getattr(tiny_vae, name) == expected == tiny_vae.config[name]


def test_unknown_attribute_is_a_plain_attribute_error(tiny_vae):
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'") as info:
        tiny_vae.no_such_thing  # noqa: B018
    assert not isinstance(info.value, NotImplementedError)


def test_wrap_carries_tiling_and_slicing_over(tiny_upstream):
    # pipe.vae.enable_tiling() is usually called before pipe.vae is replaced.
    module = ct.random_upstream("tiny", seed=0)
    module.enable_tiling(tile_sample_min_height=48, tile_sample_min_width=64, tile_overlap_factor_width=0.25)
    module.enable_slicing()
    vae = ct.wrap(module, mesh="dp=1,tp=1")
    assert vae.use_tiling and vae.use_slicing
    for name in ("tile_sample_min_height", "tile_sample_min_width", "tile_overlap_factor_height"):
        assert getattr(vae.module, name) == getattr(module, name), name
    assert vae.module.tile_overlap_factor_width == 0.25
    plain = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    assert not plain.use_tiling and not plain.use_slicing


def test_inference_mode_calls_of_training_scripts_are_no_ops(tiny_vae):
    # diffusers' training scripts call these on a VAE they then only encode with.
    assert tiny_vae.eval() is tiny_vae and tiny_vae.train(False) is tiny_vae
    assert tiny_vae.requires_grad_(False) is tiny_vae and tiny_vae.training is False
    with pytest.raises(ct.UnsupportedAttributeError, match="training mode"):
        tiny_vae.train()
    with pytest.raises(ct.UnsupportedAttributeError, match="no gradients"):
        tiny_vae.requires_grad_(True)

