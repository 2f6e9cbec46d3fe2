"""`kernels.channel_attention`: the token-major attention on channels-first operands."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cogvideox_torchax.kernels.attention import attention
from cogvideox_torchax.kernels.channel_attention import attention_channels_first, attention_channels_first_reference

from tests.support.parity import assert_close


@pytest.mark.parametrize(("length", "block"), [(12, 2048), (37, 8), (64, 16)])
def test_channels_first_attention_is_upstreams_in_fp32(length, block):
    rng = np.random.default_rng(length)
    # (B, T, C, L) as Wan's block hands them over; torch wants (..., L, C).
    q, k, v = (jnp.asarray(rng.standard_normal((2, 3, 6, length)), jnp.float32) for _ in range(3))
    got = attention_channels_first(q, k, v, block=block)
    assert got.shape == (2, 3, 6, length)
    tokens = [torch.tensor(np.asarray(a)).transpose(-1, -2) for a in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*tokens).transpose(-1, -2)
    # fp32: each query's sums as whole attention's; torch's kernel differs by ulps.
    assert_close(np.asarray(got), expected.numpy(), atol=1e-6, label=f"channels-first attention L={length}")
    assert_close(np.asarray(got), np.asarray(attention_channels_first_reference(q, k, v)), atol=1e-6)


def test_channels_first_attention_rounds_as_token_major_attention_in_bf16():
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 40)), jnp.bfloat16) for _ in range(3))
    got = attention_channels_first(q, k, v, block=16)
    token_major = attention(*(jnp.swapaxes(a, -1, -2) for a in (q, k, v)), block=16)
    assert got.dtype == jnp.bfloat16
    # fp32 logits and softmax, one rounding of the output: bf16 results one ulp apart at most.
    assert_close(np.asarray(got.astype(jnp.float32)), np.asarray(jnp.swapaxes(token_major, -1, -2)).astype(np.float32),
                 atol=2**-7, label="bf16 channels-first vs token-major")


def test_channels_first_attention_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="share D"):
        attention_channels_first(jnp.zeros((1, 4, 3)), jnp.zeros((1, 5, 3)), jnp.zeros((1, 4, 3)))
