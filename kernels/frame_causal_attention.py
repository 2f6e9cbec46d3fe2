"""Frame-causal attention computed blockwise: no mask, no key block a query block cannot see, memory linear in tokens.

HunyuanVideo's VAE attends over every latent token of the video in its
middle blocks (frames x height x width tokens, frame-major), each token
seeing the tokens of its own and earlier frames. Upstream builds that as a
dense ``tokens x tokens`` mask (``prepare_causal_attention_mask``) and hands
it to ``scaled_dot_product_attention``: at 33 x 90 x 160 latents
(720x1280 x 129 frames) 475,200 tokens, a mask of 451 GB in bf16 before
any scores. Here queries go in blocks of ``block_q`` tokens (`jax.lax.map`);
each block runs an online softmax (running maximum and sum, fp32) over key
blocks of ``block_k`` tokens, from the first up to the last one holding a
token of the query block's last frame (a loop of that many steps: the key
blocks the mask removes entirely are never read); inside a block the
frame rule is applied element by element. Alive at once: one
``block_q x block_k`` fp32 score block per batch and head, and the
accumulators. Logits and softmax are fp32 and the result is rounded once,
as torch's CPU and GPU kernels accumulate.

`frame_causal_attention_reference` is the same attention with the dense
mask, at highest precision, for checking.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

# 1024 x 1024 fp32 scores are 4 MiB; the accumulators 1024 x D fp32.
BLOCK_Q = 1024
BLOCK_K = 1024


def _check(q: jax.Array, k: jax.Array, v: jax.Array, frame_tokens: int) -> None:
    if q.ndim < 2 or q.shape != k.shape or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"q, k, v must be (..., N, D) alike (v's D may differ): {q.shape=}, {k.shape=}, {v.shape=}")
    if frame_tokens < 1 or q.shape[-2] % frame_tokens:
        raise ValueError(f"the tokens ({q.shape[-2]}) must be whole frames of frame_tokens ({frame_tokens}) each")


def _pad_tokens(x: jax.Array, to: int) -> jax.Array:
    if to == x.shape[-2]:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, to - x.shape[-2]), (0, 0)])


def _block(tokens: int, wanted: int) -> int:
    """The block size: ``tokens`` whole if it fits, else a divisor of it in ``(wanted / 4, wanted]``.

    The largest such multiple of 8 (the accelerators' tile sizes), else the
    largest divisor. A divisor needs no padded copy of q, k and v (at 720p x
    129 frames, 1.4 GB in bf16); without one, ``wanted`` and the tail padded.
    """
    if tokens <= wanted:
        return tokens
    low = wanted // 4
    for step in (8, 1):
        for size in range(wanted // step * step, low, -step):
            if size > 0 and tokens % size == 0:
                return size
    return wanted


@functools.partial(jax.jit, static_argnames=("frame_tokens", "block_q", "block_k"))
def frame_causal_attention(
    q: jax.Array,  # (..., N, D), token n in frame n // frame_tokens
    k: jax.Array,  # (..., N, D)
    v: jax.Array,  # (..., N, Dv)
    *,
    frame_tokens: int,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> jax.Array:  # (..., N, Dv), q.dtype
    """``softmax(q k^T / sqrt(D) + mask) v`` where token i sees token j iff j's frame is not after i's.

    Blockwise with an online softmax in fp32 (module docstring); upstream's
    ``prepare_causal_attention_mask`` values without the mask.
    """
    _check(q, k, v, frame_tokens)
    tokens, depth = q.shape[-2], q.shape[-1]
    block_q, block_k = _block(tokens, block_q), _block(tokens, block_k)
    q_blocks, k_blocks = -(-tokens // block_q), -(-tokens // block_k)
    qp = _pad_tokens(q, q_blocks * block_q)
    kp, vp = _pad_tokens(k, k_blocks * block_k), _pad_tokens(v, k_blocks * block_k)
    lead = q.shape[:-2]
    scale = 1.0 / math.sqrt(depth)
    frames = tokens // frame_tokens

    def one_query_block(i: jax.Array) -> jax.Array:
        start = i * block_q
        qb = jax.lax.dynamic_slice_in_dim(qp, start, block_q, axis=-2)
        q_frame = (start + jnp.arange(block_q)) // frame_tokens  # padded queries see too much; they are dropped
        # Keys up to the end of the block's last (real) frame: the blocks past it are all masked.
        last_frame = jnp.minimum((jnp.minimum(start + block_q, tokens) - 1) // frame_tokens, frames - 1)
        key_end = (last_frame + 1) * frame_tokens
        steps = (key_end + block_k - 1) // block_k

        def body(j, carry):
            top, total, acc = carry
            kb = jax.lax.dynamic_slice_in_dim(kp, j * block_k, block_k, axis=-2)
            vb = jax.lax.dynamic_slice_in_dim(vp, j * block_k, block_k, axis=-2)
            scores = jnp.einsum("...qd,...kd->...qk", qb, kb, preferred_element_type=jnp.float32) * scale
            k_index = j * block_k + jnp.arange(block_k)
            # Padded keys sit past the last token: their frame is past every real query's.
            seen = (k_index // frame_tokens)[None, :] <= q_frame[:, None]
            scores = jnp.where(seen, scores, -jnp.inf)
            new_top = jnp.maximum(top, scores.max(axis=-1))
            weights = jnp.exp(scores - new_top[..., None])
            fade = jnp.exp(top - new_top)
            total = total * fade + weights.sum(axis=-1)
            acc = acc * fade[..., None] + jnp.einsum("...qk,...kd->...qd", weights, vb.astype(jnp.float32))
            return new_top, total, acc

        # The first key block always holds frame 0, which every query sees: the maximum is finite after it.
        init = (jnp.full((*lead, block_q), -jnp.inf, jnp.float32), jnp.zeros((*lead, block_q), jnp.float32),
                jnp.zeros((*lead, block_q, v.shape[-1]), jnp.float32))
        _, total, acc = jax.lax.fori_loop(0, steps, body, init)
        return (acc / total[..., None]).astype(q.dtype)

    if q_blocks == 1:
        return one_query_block(jnp.int32(0))[..., :tokens, :]
    out = jax.lax.map(one_query_block, jnp.arange(q_blocks))  # (blocks, ..., block_q, Dv)
    out = jnp.moveaxis(out, 0, -3).reshape(*lead, q_blocks * block_q, v.shape[-1])
    return out[..., :tokens, :]


def frame_causal_attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, *, frame_tokens: int) -> jax.Array:
    """The dense mask and every score at once at highest precision, as upstream computes it, for checking."""
    _check(q, k, v, frame_tokens)
    frame = jnp.arange(q.shape[-2]) // frame_tokens
    mask = jnp.where(frame[None, :] <= frame[:, None], 0.0, -jnp.inf)
    logits = jnp.einsum("...qd,...kd->...qk", q.astype(jnp.float32), k.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) / math.sqrt(q.shape[-1])
    weights = jax.nn.softmax(logits + mask, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", weights, v.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST).astype(q.dtype)
