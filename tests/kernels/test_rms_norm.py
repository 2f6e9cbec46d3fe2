"""`kernels.rms_norm` (Wan's norm) against upstream's `WanRMS_norm` and its own pure-jnp reference."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from cogvideox_torchax.kernels.rms_norm import rms_norm, rms_norm_reference
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
