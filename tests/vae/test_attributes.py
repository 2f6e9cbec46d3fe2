"""Upstream's attributes on the wrapped VAE: plain data reads through, settings act as upstream's, the rest refused.

The rule (cogvideox_torchax.vae.attributes) is general: every public
attribute of upstream's module whose value is plain data when read, for
every family, including ones a later diffusers adds. Writes of upstream's
settings (tiling, slicing, frames per batch) give upstream's output with
the same setting (fp32, tolerances stated per test); writes of upstream's
other attributes are refused naming what sets them.
"""

import pytest
import torch
from diffusers import AutoencoderKLCogVideoX

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.vae.attributes import _MODULE_ATTRIBUTES_KEPT, INFERENCE_SURFACE, _own_name, is_plain
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode

# Attributes that diffusers' pipelines read (Wan's) or that tell a VAE's
# shape rules, refused before they read through; any other family: the
# ModelMixin ones every family has.
EXPECTED_PLAIN = {
    "cogvideox": {"num_latent_frames_batch_size", "num_sample_frames_batch_size", "tile_sample_min_height",
                  "tile_latent_min_width", "tile_overlap_factor_height", "quant_conv", "post_quant_conv"},
    "wan": {"z_dim", "temperal_downsample", "temperal_upsample", "spatial_compression_ratio",
            "tile_sample_min_height", "tile_sample_stride_width"},
}
EVERY_FAMILY = {"is_gradient_checkpointing", "has_compatibles", "ignore_for_config", "use_tiling", "use_slicing"}


@pytest.fixture(scope="module")
def wrapped_tiny(tiny_upstream, tiny_vae):
    """Each family's tiny upstream module and that module wrapped, once (CogVideoX's: the session's)."""
    pairs = {}

    def get(family: str):
        if family == "cogvideox":
            return tiny_upstream, tiny_vae
        if family not in pairs:
            preset = next(name for name in families.get(family).presets if "tiny" in name)
            upstream = ct.random_upstream(preset, seed=0)
            pairs[family] = (upstream, ct.wrap(upstream, mesh="dp=1,tp=1"))
        return pairs[family]

    return get


@pytest.fixture(params=sorted(families.FAMILIES))
def pair(request, wrapped_tiny):
    return request.param, *wrapped_tiny(request.param)


def _public(module) -> dict:
    found = {}
    for name in dir(module):
        if not name.startswith("_"):
            try:
                found[name] = getattr(module, name)
            except Exception:  # noqa: S112 (a property upstream's module cannot answer either)
                continue
    return found


def _ours(vae, name: str) -> bool:
    # The VAE's own API (its inference surface and torch's module bookkeeping it keeps), not read through.
    return name in INFERENCE_SURFACE or name in _MODULE_ATTRIBUTES_KEPT or _own_name(type(vae), name)


def test_every_plain_attribute_reads_as_upstreams(pair):
    family, upstream, vae = pair
    plain = {name: value for name, value in _public(upstream).items() if is_plain(value)}
    expected = EXPECTED_PLAIN.get(family, set()) | EVERY_FAMILY
    assert expected <= set(plain), sorted(expected - set(plain))
    for name, value in plain.items():
        assert hasattr(vae, name), name
        got = getattr(vae, name)
        assert got == value and type(got) is type(value), (name, got, value)


def test_everything_else_of_upstreams_stays_refused(pair):
    _, upstream, vae = pair
    read = vae.family.pipeline_buffers  # the tensors its pipelines read (below)
    refused = [n for n, v in _public(upstream).items() if not is_plain(v) and not _ours(vae, n) and n not in read]
    # Parameters, submodules, hooks, training and checkpointing switches, register_to_config.
    assert {"parameters", "encoder", "decoder", "state_dict", "register_forward_hook", "enable_gradient_checkpointing",
            "register_to_config", "load_state_dict"} <= set(refused)
    for name in refused:
        assert not hasattr(vae, name), name
        with pytest.raises(ct.UnsupportedAttributeError, match=rf"\.{name}: it runs only the inference surface"):
            getattr(vae, name)
    with pytest.raises(ct.UnsupportedAttributeError, match="training mode"):
        vae.train(True)


def test_the_buffers_a_familys_pipelines_read_are_host_copies_of_upstreams(pair):
    # LTX2Pipeline normalises latents by vae.latents_mean and vae.latents_std; the other families' read none.
    _, upstream, vae = pair
    buffers = dict(upstream.named_buffers())
    for name in vae.family.pipeline_buffers:
        got = getattr(vae, name)
        assert isinstance(got, torch.Tensor) and got.device.type == "cpu" and got.dtype == buffers[name].dtype
        assert torch.equal(got, buffers[name]), name
    assert set(vae.family.pipeline_buffers) <= set(buffers)


def test_plain_is_judged_by_the_value_when_read_whatever_the_name(pair, monkeypatch):
    # An attribute a later diffusers adds reads through with no change here.
    _, upstream, vae = pair
    upstream_class = vae.family.upstream
    monkeypatch.setattr(upstream_class, "added_later", (1, 2.5, "x", None, [True, 3]), raising=False)
    assert vae.added_later == (1, 2.5, "x", None, [True, 3])
    vae.added_later[4].append(9)  # a copy: reading never changes the VAE
    assert vae.added_later == upstream.added_later
    for value in (torch.zeros(2), [1, torch.zeros(1)], (torch.nn.Linear(1, 1),), lambda: 1):
        monkeypatch.setattr(upstream_class, "added_later", value, raising=False)
        assert not hasattr(vae, "added_later")
        with pytest.raises(ct.UnsupportedAttributeError, match="added_later"):
            vae.added_later  # noqa: B018


def test_unknown_names_and_config_access_are_as_before(tiny_vae):
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'") as info:
        tiny_vae.no_such_thing  # noqa: B018
    assert not isinstance(info.value, NotImplementedError)
    with pytest.warns(FutureWarning, match="latent_channels"):
        assert tiny_vae.latent_channels == 4


# -- writes ----------------------------------------------------------------


def _set(vaes, **settings):
    for vae in vaes:
        for name, value in settings.items():
            setattr(vae, name, value)


def test_cogvideox_tiles_set_by_hand_decode_as_upstream(monkeypatch):
    upstream = ct.random_upstream("tiny", seed=0)
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn((1, 4, 1, 4, 4), generator=torch.Generator().manual_seed(0))
    plain = upstream_decode(upstream, z)
    resets = []
    reset = vae.reset_programs
    vae.reset_programs = lambda: resets.append(1) or reset()  # the VAE's own name: set as on any module
    # 3x3-latent tiles overlapping by one third, set as a user would, on both.
    settings = {"use_tiling": True, "tile_sample_min_height": 24, "tile_sample_min_width": 24,
                "tile_latent_min_height": 3, "tile_latent_min_width": 3, "tile_overlap_factor_height": 1 / 3,
                "tile_overlap_factor_width": 1 / 3}
    _set((upstream, vae), **settings)
    assert len(resets) == len(settings)  # programs dropped at each change, as enable_tiling drops them
    _set((vae,), use_slicing=True, tile_sample_min_height=24)  # slicing is read per call; 24 is no change
    assert len(resets) == len(settings) and vae.use_slicing and vae.tile_latent_min_height == 3
    expected = upstream_decode(upstream, z)
    assert (expected - plain).abs().max() > 1e-2  # the tiles change upstream's output
    # fp32, tiled and blended as upstream's: measured 3.8e-6.
    assert_close(vae.decode(z).sample, expected, atol=1e-5, label="CogVideoX tiles set by hand")


def test_cogvideox_frame_batches_set_by_hand_decode_as_upstream():
    upstream = ct.random_upstream("tiny", seed=0)
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn((1, 4, 3, 2, 2), generator=torch.Generator().manual_seed(0))
    assert upstream_decode(upstream, z).shape[2] == 9  # 2 latent frames per batch: 8 + 1 frames
    _set((upstream, vae), num_latent_frames_batch_size=3)
    expected = upstream_decode(upstream, z)
    assert expected.shape == (1, 3, 9, 16, 16)
    # fp32: measured 8.5e-7.
    assert_close(vae.decode(z).sample, expected, atol=1e-5, label="CogVideoX frame batches set by hand")
    # Kept through a dtype change (the converted programs start from the module's settings).
    vae.to(torch.bfloat16)
    assert vae.module.num_latent_frames_batch_size == 3


def test_cogvideox_sample_frame_batches_set_by_hand_encode_as_upstream():
    upstream = ct.random_upstream("tiny", seed=0)
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    x = torch.rand((1, 3, 9, 16, 16), generator=torch.Generator().manual_seed(1)) * 2 - 1
    _set((upstream, vae), num_sample_frames_batch_size=4)
    with torch.no_grad():
        expected = upstream.encode(x).latent_dist.mode()
    # fp32 encode: measured 3.1e-7.
    assert_close(vae.encode(x).latent_dist.mode(), expected, atol=1e-5, label="sample frame batches set by hand")


def test_wan_tiles_set_by_hand_decode_as_upstream():
    upstream = ct.random_upstream("wan-tiny", seed=0)
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn((1, 16, 1, 4, 4), generator=torch.Generator().manual_seed(0))
    plain = upstream_decode(upstream, z)
    _set((upstream, vae), use_tiling=True, tile_sample_min_height=16, tile_sample_min_width=16,
         tile_sample_stride_height=8, tile_sample_stride_width=8)
    expected = upstream_decode(upstream, z)
    assert (expected - plain).abs().max() > 1e-3  # the tiles change upstream's output
    # fp32: measured 6e-8.
    assert_close(vae.decode(z).sample, expected, atol=1e-5, label="Wan tiles set by hand")


def test_wrap_takes_settings_set_by_hand_on_the_module():
    module = ct.random_upstream("tiny", seed=0)
    module.num_latent_frames_batch_size, module.tile_latent_min_height = 1, 3
    module.use_slicing = True
    vae = ct.wrap(module, mesh="dp=1,tp=1")
    assert (vae.num_latent_frames_batch_size, vae.tile_latent_min_height, vae.use_slicing) == (1, 3, True)
    assert module.num_latent_frames_batch_size == 1  # the module is left as it was


def test_writes_of_upstreams_other_attributes_are_refused_naming_what_sets_them(wrapped_tiny, tiny_vae):
    _, wan = wrapped_tiny("wan")
    with pytest.raises(ct.UnsupportedAttributeError, match=r"AutoencoderKLWan\.z_dim.*from_config.*tile_sample_min"):
        wan.z_dim = 4
    assert wan.z_dim == 16
    for name, value in (("temperal_downsample", [True, True, True]), ("spatial_compression_ratio", 4)):
        with pytest.raises(ct.UnsupportedAttributeError, match="fixed when the VAE is built"):
            setattr(wan, name, value)
    with pytest.raises(ct.UnsupportedAttributeError, match=r"AutoencoderKLCogVideoX\.quant_conv"):
        tiny_vae.quant_conv = torch.nn.Identity()
    with pytest.raises(TypeError, match="plain data"):
        wan.tile_sample_min_height = torch.tensor(64)
    assert wan.tile_sample_min_height == 256
    # A name upstream's module does not have is the VAE's own, as on any module.
    tiny_vae.a_note_of_mine = 1
    assert tiny_vae.a_note_of_mine == 1
    del tiny_vae.a_note_of_mine


# -- the meta device ---------------------------------------------------------


def test_wrapping_a_module_without_its_weights_names_the_fix():
    config = ct.random_upstream("tiny").config
    with torch.device("meta"):
        module = AutoencoderKLCogVideoX.from_config(config)
    with pytest.raises(ValueError, match=r"weights are on the meta device.*Load the weights first"):
        ct.wrap(module, mesh="dp=1,tp=1")
