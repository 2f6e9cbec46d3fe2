"""The Flax NNX peer (`bench.flax_vae`) against upstream diffusers, fp32 eager on the CPU."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLCogVideoX
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from bench import flax_vae
from bench.flax_vae import ACTIVATION_SPEC, FlaxCogVideoXDecoder, FlaxVAE, activation_sharding, from_upstream
from bench.flax_weights import StateDictMismatch, _torch_key_for, convert_state_dict, torch_key_to_nnx
from cogvideox_torchax.config import preset_config
from tests.support.parity import assert_close, psnr
from tests.support.reference import upstream_decode

# Frame counts 1, 2, 3, 5, 7: one batch (T=1), an even batch, an odd first
# batch (the first-frame special cases), an odd first batch plus one cached
# batch, and plus two (the conv cache carried through the scan).
# Batch 2 and non-square latents ride along.
TINY_SHAPES = [(1, 4, 1, 4, 4), (2, 4, 2, 4, 6), (1, 4, 3, 6, 4), (1, 4, 5, 2, 4), (2, 4, 7, 2, 4)]
# fp32 against fp32: measured max abs err 2e-6 to 1.3e-5 on outputs of max ~4.
TINY_ATOL = 2e-5
# Measured 1.1e-5 to 2.1e-5 on the 2b config at these shapes.
ATOL_2B = 1e-4
# Measured 69.0 dB on this test's latents (64.8 dB on others, where torch's
# own bf16 decode gets 65.7 dB).
BF16_MIN_PSNR_DB = 55.0


def _latents(shape, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tiny_flax(tiny_upstream) -> FlaxVAE:
    return from_upstream(tiny_upstream, dtype="float32")


@pytest.fixture(scope="module")
def tiny_abstract_state(tiny_upstream) -> nnx.State:
    """The tiny decoder's parameters as shapes only (no init)."""
    config = dict(tiny_upstream.config)
    return nnx.split(nnx.eval_shape(lambda: FlaxCogVideoXDecoder(config, rngs=nnx.Rngs(0))))[1]


# --- the key map ---------------------------------------------------------------------------------


def test_key_map_covers_the_decoder(tiny_upstream, tiny_flax):
    state_dict = tiny_upstream.state_dict()
    decode_keys = [k for k in state_dict if k.startswith("decoder.")]
    paths = {}
    for key in decode_keys:
        path, _ = torch_key_to_nnx(key, state_dict[key].ndim)
        assert _torch_key_for(path) == key
        paths[path] = key
    assert set(paths) == {tuple(p) for p, _ in nnx.to_flat_state(tiny_flax.state)}
    # Encoder keys are skipped, and the config has no post_quant_conv.
    assert torch_key_to_nnx("encoder.conv_in.conv.weight", 5) is None
    assert not any(k.startswith("post_quant_conv.") for k in state_dict)
    # Conv3d OIDHW -> DHWIO, loaded as is.
    kernel = tiny_flax.state["decoder"]["conv_in"]["conv"]["kernel"][...]
    torch_weight = state_dict["decoder.conv_in.conv.weight"].numpy()
    np.testing.assert_array_equal(np.asarray(kernel), torch_weight.transpose(2, 3, 4, 1, 0))


def _missing(sd):
    del sd["decoder.up_blocks.1.upsamplers.0.conv.weight"]
    return "decoder.up_blocks.1.upsamplers.0.conv.weight"


def _unexpected(sd):
    sd["decoder.mid_block.resnets.2.conv1.conv.weight"] = sd["decoder.mid_block.resnets.1.conv1.conv.weight"]
    return "decoder.mid_block.resnets.2.conv1.conv.weight"


def _wrong_shape(sd):
    sd["decoder.norm_out.norm_layer.weight"] = torch.ones(3)
    return "decoder.norm_out.norm_layer.weight"


def test_key_map_loads_post_quant_conv_when_the_config_has_one():
    # Upstream builds it with out_channels in and out, so only a 3-channel
    # latent config can decode with it (checked by hand: max abs err 6e-6).
    config = {**preset_config("tiny"), "latent_channels": 3, "use_post_quant_conv": True}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        upstream = AutoencoderKLCogVideoX.from_config(config).eval()
    vae = from_upstream(upstream)
    kernel = np.asarray(vae.state["post_quant_conv"]["kernel"][...])
    np.testing.assert_array_equal(kernel, upstream.post_quant_conv.weight.detach().numpy().transpose(2, 3, 4, 1, 0))


@pytest.mark.parametrize("break_it", [_missing, _unexpected, _wrong_shape], ids=["missing", "unexpected", "shape"])
def test_key_map_names_the_key_that_does_not_fit(tiny_upstream, tiny_abstract_state, break_it):
    state_dict = dict(tiny_upstream.state_dict())
    key = break_it(state_dict)
    with pytest.raises(StateDictMismatch, match=key.replace(".", r"\.")) as info:
        convert_state_dict(state_dict, tiny_abstract_state)
    print(info.value)


# --- parity ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", TINY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiny_matches_upstream(tiny_upstream, tiny_flax, shape):
    z = _latents(shape)
    expected = upstream_decode(tiny_upstream, z)
    assert_close(tiny_flax.decode(z), expected, atol=TINY_ATOL, label=f"flax tiny {shape}")


@pytest.fixture(scope="module")
def flax_2b(upstream_2b) -> FlaxVAE:
    return from_upstream(upstream_2b, dtype="float32")


@pytest.mark.slow
@pytest.mark.parametrize("frames", [1, 2, 3])  # 3 chains one later batch; longer chains on the tiny config
def test_2b_matches_upstream(upstream_2b, reference_2b, flax_2b, frames):
    """The real architecture; upstream's decodes are shared with tests/families/cogvideox/test_decode.py."""
    assert not upstream_2b.config.use_post_quant_conv  # the real config decodes without one
    z, expected = reference_2b(frames)
    assert_close(flax_2b.decode(z), expected, atol=ATOL_2B, label=f"flax 2b T={frames}")


def test_bf16_decode_is_close_to_fp32(tiny_upstream):
    z = _latents(TINY_SHAPES[1])
    expected = upstream_decode(tiny_upstream, z)
    vae = from_upstream(tiny_upstream, dtype="bfloat16")
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(vae.state))
    actual = vae.decode(z)
    assert actual.dtype == jnp.bfloat16
    actual = np.asarray(actual.astype(jnp.float32))
    assert np.isfinite(actual).all()
    db = psnr(actual, expected)
    print(f"[parity] flax tiny bf16: PSNR {db:.1f} dB against fp32 upstream")
    assert db >= BF16_MIN_PSNR_DB


def test_param_dtype_and_fp32_group_norm_statistics(tiny_upstream):
    vae = from_upstream(tiny_upstream, dtype="bfloat16", param_dtype="float32")
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(vae.state))
    lowered = vae.lower(TINY_SHAPES[0])
    assert lowered.out_info.dtype == jnp.bfloat16
    # Every reduction (the GroupNorm means and variances) runs in fp32.
    z = jax.ShapeDtypeStruct(TINY_SHAPES[0], jnp.bfloat16)
    jaxpr = jax.make_jaxpr(vae.decode_fn())(vae.state, z)
    reductions = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name.startswith("reduce_")]
    assert len(reductions) >= 2 * 16  # mean and variance of each of the tiny config's 16 norms
    assert {str(e.invars[0].aval.dtype) for e in reductions} == {"float32"}


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


# --- the jitted program ---------------------------------------------------------------------------


def test_weights_are_jit_arguments_and_transposes_only_at_the_boundary(tiny_flax):
    lowered = tiny_flax.lower(TINY_SHAPES[0])
    (state_info, z_info), _ = lowered.args_info
    state_leaves = jax.tree.leaves(tiny_flax.state)
    info_leaves = jax.tree.leaves(state_info)
    assert len(info_leaves) == len(state_leaves)
    assert [i.shape for i in info_leaves] == [s.shape for s in state_leaves]
    assert z_info.shape == TINY_SHAPES[0]
    # Not baked in: no constant as large as even the smallest conv kernel.
    smallest_kernel = min(leaf.size for leaf in state_leaves if leaf.ndim > 1)
    assert _largest_constant(lowered.as_text()) < smallest_kernel
    # NCTHW in and out of the jit, NTHWC inside: exactly two transposes.
    jaxpr = jax.make_jaxpr(tiny_flax.decode_fn())(tiny_flax.state, z_info)
    assert [e.primitive.name for e in _equations(jaxpr.jaxpr)].count("transpose") == 2


def _largest_constant(stablehlo: str) -> int:
    # Elements of the largest non-scalar `stablehlo.constant` in the program.
    shapes = re.findall(r"stablehlo\.constant dense<.*?> : tensor<((?:\d+x)+)\w+>", stablehlo)
    return max((int(np.prod([int(d) for d in s.rstrip("x").split("x")])) for s in shapes), default=0)


def test_outputs_are_not_clamped(tiny_upstream, tiny_flax):
    z = 50 * _latents(TINY_SHAPES[1])
    expected = upstream_decode(tiny_upstream, z)
    actual = tiny_flax.decode(z)
    assert float(expected.abs().max()) > 1
    assert float(jnp.abs(actual).max()) > 1
    # Outputs reach ~100; measured max abs err 2.3e-4 (relative ~2e-6).
    assert_close(actual, expected, atol=1e-3, label="flax tiny 50x latents")


def test_activation_constraints_on_the_input_each_resnet_each_up_block_and_the_output(tiny_upstream, monkeypatch):
    # One device cannot split anything, so `activation_sharding` skips the
    # constraints; force them on to see where they go.
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
    sharding = NamedSharding(mesh, ACTIVATION_SPEC)
    monkeypatch.setattr(flax_vae, "activation_sharding", lambda mesh: sharding)
    config = dict(tiny_upstream.config)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: FlaxCogVideoXDecoder(config, mesh=mesh, rngs=nnx.Rngs(0))))

    def decode(state, z):
        return nnx.merge(graphdef, state)(z)

    jaxpr = jax.make_jaxpr(decode)(state, jax.ShapeDtypeStruct((1, 2, 4, 4, 4), jnp.float32))
    constraints = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "sharding_constraint"]
    # Input, each of the 2 + 4 * 2 resnets, each of the 4 up blocks, output.
    assert len(constraints) == 1 + 10 + 4 + 1
    assert all(e.params["sharding"].spec == ACTIVATION_SPEC for e in constraints)


def test_one_by_one_mesh(tiny_upstream):
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
    assert activation_sharding(mesh) is None  # one device: no constraints
    vae = from_upstream(tiny_upstream, mesh=mesh)
    z = _latents(TINY_SHAPES[0])
    actual = vae.decode(z)
    assert isinstance(actual.sharding, NamedSharding) and actual.sharding.mesh.devices.shape == (1, 1)
    assert_close(actual, upstream_decode(tiny_upstream, z), atol=TINY_ATOL, label="flax tiny on a 1x1 mesh")
    with pytest.raises(ValueError, match="mesh axes"):
        from_upstream(tiny_upstream, mesh=Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("x", "y")))
