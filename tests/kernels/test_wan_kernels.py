"""The kernels Wan's patches use, against their pure-jnp references and upstream torch."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cogvideox_torchax.kernels.attention import attention, attention_reference
from cogvideox_torchax.kernels.rms_norm import rms_norm, rms_norm_reference
from cogvideox_torchax.kernels.upsample import nearest, nearest_indices

from tests.support.parity import assert_close


@pytest.mark.parametrize("shape", [(2, 6, 3, 4, 5), (3, 4, 5, 7)])
def test_rms_norm_is_upstreams_in_fp32(shape):
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    norm = WanRMS_norm(shape[1], images=len(shape) == 4)
    with torch.no_grad():
        norm.gamma.mul_(torch.linspace(0.5, 1.5, shape[1]).reshape(norm.gamma.shape))
        expected = norm(x)
    gamma = jnp.asarray(norm.gamma.detach().numpy())
    got = rms_norm(jnp.asarray(x.numpy()), gamma, 0.0)
    # fp32: one division and two products in upstream's order.
    assert_close(np.asarray(got), expected.numpy(), atol=1e-6, label=f"rms_norm {shape}")
    assert_close(np.asarray(got), np.asarray(rms_norm_reference(jnp.asarray(x.numpy()), gamma, 0.0)), atol=1e-6)


def test_rms_norm_rounds_once_in_bf16():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 3, 4, 4)), jnp.bfloat16)
    gamma = jnp.linspace(0.5, 1.5, 8).reshape(8, 1, 1, 1)
    got = rms_norm(x, gamma, 0.0)
    assert got.dtype == jnp.bfloat16
    # The fp32 value rounded once: equal to the reference's single rounding.
    assert_close(np.asarray(got.astype(jnp.float32)), np.asarray(rms_norm_reference(x, gamma, 0.0).astype(jnp.float32)),
                 atol=0, label="rms_norm bf16, one rounding")


@pytest.mark.parametrize(("length", "block"), [(12, 2048), (37, 8), (64, 16)])
def test_attention_in_blocks_is_whole_attention(length, block):
    rng = np.random.default_rng(length)
    q, k, v = (jnp.asarray(rng.standard_normal((3, 1, length, 6)), jnp.float32) for _ in range(3))
    got = attention(q, k, v, block=block)
    expected = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(np.asarray(a)) for a in (q, k, v)))
    # fp32: blocks of queries give each row the same sums; torch's kernel differs by ulps.
    assert_close(np.asarray(got), expected.numpy(), atol=1e-6, label=f"attention L={length} block={block}")
    assert_close(np.asarray(got), np.asarray(attention_reference(q, k, v)), atol=1e-6)


def test_attention_rejects_mismatched_shapes():
    q = jnp.zeros((1, 4, 3))
    with pytest.raises(ValueError, match="share D"):
        attention(q, jnp.zeros((1, 4, 2)), jnp.zeros((1, 4, 2)))


@pytest.mark.parametrize(("size", "out", "factor"), [(5, 10, 2.0), (7, 3, None), (4, 9, None), (3, 7, 2.5)])
def test_nearest_exact_indices_are_torchs(size, out, factor):
    x = torch.arange(size, dtype=torch.float32).reshape(1, 1, size)
    kwargs = {"scale_factor": factor} if factor else {"size": out}
    expected = torch.nn.functional.interpolate(x, mode="nearest-exact", **kwargs)[0, 0].long().numpy()
    np.testing.assert_array_equal(nearest_indices(size, len(expected), factor, exact=True), expected)
    got = nearest(jnp.asarray(x.numpy()), (len(expected),), (factor,) if factor else None, exact=True)
    np.testing.assert_array_equal(np.asarray(got)[0, 0], expected.astype(np.float32))
