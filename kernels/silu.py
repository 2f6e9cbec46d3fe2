"""SiLU that rounds once, as torch does for bf16 and fp16.

torchax lowers ``F.silu`` to ``x * sigmoid(x)`` in the input dtype, rounding
the sigmoid and then the product; in bf16 that is ~1.4x torch's error, and
it compounds over the decoder's ~30 activations. Computing in fp32 inside
one elementwise expression costs nothing: XLA fuses the converts, so no fp32
array is stored.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def silu(x: jax.Array) -> jax.Array:  # any shape, any float dtype -> same
    """``x * sigmoid(x)`` evaluated in fp32, returned in ``x.dtype``."""
    xf = x.astype(jnp.float32)
    return (xf * jax.nn.sigmoid(xf)).astype(x.dtype)


def silu_reference(x: jax.Array) -> jax.Array:
    """The textbook formula in fp32, for checking `silu`."""
    xf = x.astype(jnp.float32)
    return (xf / (1 + jnp.exp(-xf))).astype(x.dtype)
