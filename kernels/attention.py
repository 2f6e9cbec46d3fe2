"""Single-head scaled dot-product attention with fp32 softmax, one block of queries at a time.

Wan's VAE attends over every pixel of a latent frame in its middle block
(`WanAttentionBlock`: one head, ``C`` channels, ``L = H * W`` tokens).
torchax lowers ``F.scaled_dot_product_attention`` to its reference: the
``L x L`` logits in the input's dtype and a softmax there. Here the logits
and softmax are fp32 (torch's own kernels accumulate in fp32 too), the
output is rounded once, and queries go in blocks of ``block`` rows
(`jax.lax.map`), so at most ``block x L`` logits are alive: at 720p
(90 x 160 latents, 14,400 tokens) the whole fp32 matrix would be 0.83 GB
per frame.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

# Rows of queries per block: 2048 x 14,400 fp32 logits are 118 MB.
BLOCK = 2048


def _check(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if q.ndim < 2 or q.shape[:-2] != k.shape[:-2] or k.shape != v.shape[:-1] + (k.shape[-1],):
        raise ValueError(f"q, k, v must be (..., L, D) with k and v alike: {q.shape=}, {k.shape=}, {v.shape=}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"q and k must share D, k and v L: {q.shape=}, {k.shape=}, {v.shape=}")


def _block(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=jnp.float32) * scale
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", weights, v.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("block",))
def attention(
    q: jax.Array,  # (..., L, D)
    k: jax.Array,  # (..., S, D)
    v: jax.Array,  # (..., S, Dv)
    *,
    block: int = BLOCK,
) -> jax.Array:  # (..., L, Dv), q.dtype
    """``softmax(q k^T / sqrt(D)) v`` in fp32, rounded once; queries ``block`` rows at a time."""
    _check(q, k, v)
    length = q.shape[-2]
    if length <= block:
        return _block(q, k, v).astype(q.dtype)
    blocks = -(-length // block)
    pad = blocks * block - length
    qp = jnp.pad(q, [(0, 0)] * (q.ndim - 2) + [(0, pad), (0, 0)])
    qb = jnp.moveaxis(qp.reshape(*q.shape[:-2], blocks, block, q.shape[-1]), -3, 0)
    out = jax.lax.map(lambda qi: _block(qi, k, v).astype(q.dtype), qb)  # (blocks, ..., block, Dv)
    out = jnp.moveaxis(out, 0, -3).reshape(*q.shape[:-2], blocks * block, v.shape[-1])
    return out[..., :length, :]


def attention_reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """All queries at once at highest precision, for checking `attention`."""
    _check(q, k, v)
    logits = jnp.einsum("...qd,...kd->...qk", q.astype(jnp.float32), k.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) / math.sqrt(q.shape[-1])
    return jnp.einsum("...qk,...kd->...qd", jax.nn.softmax(logits, axis=-1), v.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST).astype(q.dtype)
