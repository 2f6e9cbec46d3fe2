"""`kernels.silu` against torch and its own reference, in fp32, bf16 and fp16."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.support.parity import assert_close


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_silu_matches_torch_and_reference(dtype):
    from cogvideox_torchax.kernels.silu import silu, silu_reference

    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32) * 4
    xt = torch.from_numpy(x).to({jnp.bfloat16: torch.bfloat16, jnp.float16: torch.float16}.get(dtype, torch.float32))
    expected = torch.nn.functional.silu(xt).float().numpy()
    xj = jnp.asarray(xt.float().numpy(), dtype)
    got = silu(xj)
    assert got.dtype == dtype
    # bf16 and fp16: one rounding, as torch: equal to the last bit.
    atol = 0.0 if dtype != jnp.float32 else 1e-6
    assert_close(np.asarray(got.astype(jnp.float32)), expected, atol=atol, label=f"silu {dtype.__name__}")
    assert_close(np.asarray(silu_reference(xj).astype(jnp.float32)), expected, atol=max(atol, 1e-6), label="reference")
