"""`kernels.attention` for channels-first operands: ``(..., D, L)`` in, ``(..., Dv, L)`` out.

Wan's middle block attends over every pixel of a frame, and its activations
are ``(B, C, T, H, W)``: channels before pixels. Token-major attention
(``(..., L, D)``) needs the queries, keys and values transposed into that
order and the result back, activation-sized transposes in a program that
otherwise has none (compiled for an H200). Here both products contract or
keep the channel axis where it stands (``q^T k`` and ``v w^T``, which the
GEMMs read transposed), and queries go in blocks of ``block`` columns,
sliced and written back in place, so no operand changes layout. fp32
logits and softmax, the output rounded once, as `kernels.attention`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from cogvideox_torchax.kernels.attention import BLOCK, attention_reference


def _check(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if q.ndim < 2 or q.shape[:-2] != k.shape[:-2] or v.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q, k, v must be (..., D, L) over the same leading dims: {q.shape=}, {k.shape=}, {v.shape=}")
    if q.shape[-2] != k.shape[-2] or k.shape[-1] != v.shape[-1]:
        raise ValueError(f"q and k must share D, k and v L: {q.shape=}, {k.shape=}, {v.shape=}")


def _block(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    scale = 1.0 / math.sqrt(q.shape[-2])
    logits = jnp.einsum("...dq,...dk->...qk", q, k, preferred_element_type=jnp.float32) * scale
    weights = jax.nn.softmax(logits, axis=-1)
    # v first: the product comes out (..., Dv, block), as stored.
    return jnp.einsum("...vk,...qk->...vq", v.astype(jnp.float32), weights)


@functools.partial(jax.jit, static_argnames=("block",))
def attention_channels_first(
    q: jax.Array,  # (..., D, L)
    k: jax.Array,  # (..., D, S)
    v: jax.Array,  # (..., Dv, S)
    *,
    block: int = BLOCK,
) -> jax.Array:  # (..., Dv, L), q.dtype
    """``(softmax(q^T k / sqrt(D)) v^T)^T`` in fp32, rounded once; queries ``block`` columns at a time."""
    _check(q, k, v)
    length = q.shape[-1]
    if length <= block:
        return _block(q, k, v).astype(q.dtype)
    blocks = -(-length // block)
    qp = jnp.pad(q, [(0, 0)] * (q.ndim - 1) + [(0, blocks * block - length)])
    out = jnp.zeros((*v.shape[:-1], blocks * block), q.dtype)

    def body(i, out):
        qi = jax.lax.dynamic_slice_in_dim(qp, i * block, block, axis=-1)
        return jax.lax.dynamic_update_slice_in_dim(out, _block(qi, k, v).astype(q.dtype), i * block, axis=-1)

    return jax.lax.fori_loop(0, blocks, body, out)[..., :length]


def attention_channels_first_reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`kernels.attention.attention_reference` on the token-major transposes, for checking."""
    _check(q, k, v)
    return jnp.swapaxes(attention_reference(jnp.swapaxes(q, -1, -2), jnp.swapaxes(k, -1, -2),
                                            jnp.swapaxes(v, -1, -2)), -1, -2)
