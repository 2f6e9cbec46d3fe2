"""`kernels.attention` (Wan's) in blocks of queries against torch's attention and its own pure-jnp reference."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from cogvideox_torchax.kernels.attention import attention, attention_reference
from tests.support.parity import assert_close


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
