"""The patches every family takes (``conv_bias``, ``silu``, ``nearest_upsample``, ``shard_activations``), each alone."""

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSafeConv3d
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

import cogvideox_torchax as ct
from cogvideox_torchax import families, patches
from cogvideox_torchax._torch_compat import import_torchax
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode

# torchax's device as this package imports it: "jax" is never registered with torch
# (cogvideox_torchax._torchax_device), so torch parses a module's .to() under its own name.
DEVICE = "privateuseone"

torchax = import_torchax()

# Each family's tiny test config: a shared patch must hold for all of them.
PRESETS = ("tiny", "wan-tiny")


def _latents(module) -> torch.Tensor:
    channels = families.of_module(module).latent_channels(module.config)
    return torch.randn(1, channels, 3, 4, 4, generator=torch.Generator().manual_seed(0))


def _keys_and_shapes(m):
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("apply", [patches.apply_silu, patches.apply_conv_bias])
def test_class_patches_are_idempotent_and_keep_eager_results(preset, apply):
    fresh = ct.random_upstream(preset, seed=1)
    z = _latents(fresh)
    before = upstream_decode(fresh, z)
    keys = _keys_and_shapes(fresh)
    assert apply(fresh) > 0
    assert apply(fresh) == 0
    assert _keys_and_shapes(fresh) == keys
    # Eager torch on plain tensors still runs the upstream computation.
    assert_close(upstream_decode(fresh, z), before, atol=1e-6, label=f"{apply.__name__} ({preset})")


@pytest.mark.parametrize("preset", PRESETS)
def test_width_sharding_meshes_replace_and_remove(preset):
    fresh = ct.random_upstream(preset, seed=1)
    z = _latents(fresh)
    before = upstream_decode(fresh, z)
    mesh = ct.make_mesh("dp=1,tp=1")
    assert patches.apply_width_sharding(fresh, mesh) == 0  # one device: nothing to constrain

    class FakeMesh:  # a two-device mesh is not available in this process
        size = 2

    first, second = FakeMesh(), FakeMesh()
    n = patches.apply_width_sharding(fresh, first)
    assert n > 0
    assert patches.apply_width_sharding(fresh, second) == n
    sharded = [m for m in fresh.modules() if isinstance(m, patches.ShardedOutputMixin)]
    assert len(sharded) == n and all(m.activation_mesh is second for m in sharded)  # replaced, not stacked
    assert patches.apply_width_sharding(fresh, None) == 0
    assert all(m.activation_mesh is None for m in sharded)
    # Eager torch still runs as upstream through the mixin.
    assert_close(upstream_decode(fresh, z), before, atol=1e-6, label=f"width sharding, eager ({preset})")


def test_conv_bias_same_numbers_under_torchax():
    # `nn.Conv2d` swapped for `JaxConv2d`; each family's own convolution
    # class (CogVideoX's chunked safe conv, Wan's causal conv) given the
    # `FusedBiasConv` mixin in front of its own forward.
    conv2 = torch.nn.Conv2d(4, 6, kernel_size=3, padding=1).eval()
    safe3 = CogVideoXSafeConv3d(4, 6, kernel_size=3, padding=(0, 1, 1)).eval()
    causal3 = WanCausalConv3d(4, 6, kernel_size=3, padding=1).eval()
    holder = torch.nn.Sequential(conv2, safe3, causal3)
    x2, x3 = torch.randn(2, 4, 6, 7), torch.randn(1, 4, 5, 6, 7)
    with torch.no_grad():
        expected = conv2(x2), safe3(x3), causal3(x3)
    assert patches.apply_conv_bias(holder) == 3
    assert type(safe3) is patches.mixed(patches.FusedBiasConv, CogVideoXSafeConv3d)
    env = torchax.default_env()
    with env, torch.no_grad():
        holder.to(DEVICE)
        got = conv2(x2.to(DEVICE)).to("cpu"), safe3(x3.to(DEVICE)).to("cpu"), causal3(x3.to(DEVICE)).to("cpu")
    assert_close(got[0], expected[0], atol=1e-5, label="conv2d with fused bias")
    assert_close(got[1], expected[1], atol=1e-5, label="CogVideoX's safe conv3d with fused bias")
    assert_close(got[2], expected[2], atol=1e-5, label="Wan's causal conv3d with fused bias")


def test_nearest_override_lives_in_our_own_environment():
    ours = patches.traced_environment(True)
    assert ours is patches.traced_environment(True) and ours is not patches.traced_environment(False)
    assert ours is not torchax.default_env()  # torchax's default environment is never edited
