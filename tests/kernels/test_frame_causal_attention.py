"""`kernels.frame_causal_attention` against its dense-mask reference and upstream's masked attention in torch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import prepare_causal_attention_mask

from cogvideox_torchax.kernels.frame_causal_attention import (
    _block,
    frame_causal_attention,
    frame_causal_attention_reference,
)
from tests.support.parity import assert_close


def _qkv(shape, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype) * 2 for k in keys)


# (batch/heads, frames, tokens per frame, depth, query block, key block), the blocks as `_block` takes them:
# blocks of 5 splitting frames of 6, blocks larger than the video, a frame per block, one frame, blocks of 3 and 7
# across frames of 3, and 26 tokens that no block in (3, 12] divides (blocks of 12, the tail padded).
CASES = [((1,), 5, 6, 8, 5, 5), ((2, 1), 3, 4, 16, 1024, 1024), ((1,), 4, 9, 8, 9, 9), ((2,), 1, 6, 4, 3, 3),
         ((1, 2), 7, 3, 5, 3, 7), ((1,), 2, 13, 8, 12, 12)]


def test_block_sizes_divide_the_tokens_where_they_can():
    assert _block(30, 5) == 5 and _block(21, 7) == 7 and _block(26, 12) == 12  # 26: padded
    assert _block(475_200, 1024) == 960  # 720p x 129 frames: the largest multiple of 8 dividing it
    assert _block(20, 1024) == 20


@pytest.mark.parametrize(("lead", "frames", "per_frame", "depth", "block_q", "block_k"), CASES)
def test_blockwise_equals_the_dense_mask(lead, frames, per_frame, depth, block_q, block_k):
    tokens = frames * per_frame
    assert (_block(tokens, block_q), _block(tokens, block_k)) == (min(block_q, tokens), min(block_k, tokens))
    q, k, v = _qkv((*lead, tokens, depth), seed=frames)
    got = frame_causal_attention(q, k, v, frame_tokens=per_frame, block_q=block_q, block_k=block_k)
    # fp32: online softmax against the dense one at highest precision, values up to ~6: 2.3e-6 seen.
    assert_close(got, frame_causal_attention_reference(q, k, v, frame_tokens=per_frame), atol=1e-5,
                 label=f"blockwise {lead} {frames}x{per_frame}")


def test_it_is_upstreams_masked_attention():
    # Upstream's own mask and torch's attention, as HunyuanVideo's middle block computes it.
    frames, per_frame, depth = 4, 6, 8
    q, k, v = _qkv((2, 1, frames * per_frame, depth), seed=3)
    mask = prepare_causal_attention_mask(frames, per_frame, torch.float32, "cpu", batch_size=2).unsqueeze(1)
    tq, tk, tv = (torch.from_numpy(np.asarray(a)) for a in (q, k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    got = frame_causal_attention(q, k, v, frame_tokens=per_frame, block_q=5, block_k=7)
    assert_close(np.asarray(got), expected.numpy(), atol=1e-5, label="against upstream's mask")


def test_key_blocks_past_the_last_frame_are_never_read():
    # NaN in every key and value of the last two frames: queries whose blocks end before them stay finite, so
    # those key blocks were never computed (a mask applied to them would still spread the NaN through 0 * NaN).
    frames, per_frame = 6, 4
    q, k, v = _qkv((1, frames * per_frame, 8), seed=1)
    cut = 4 * per_frame
    k, v = k.at[:, cut:].set(jnp.nan), v.at[:, cut:].set(jnp.nan)
    got = np.asarray(frame_causal_attention(q, k, v, frame_tokens=per_frame, block_q=per_frame, block_k=per_frame))
    assert np.isfinite(got[:, :cut]).all() and np.isnan(got[:, cut:]).all()


def test_bf16_rounds_once_and_keeps_its_dtype():
    q, k, v = _qkv((1, 4 * 9, 8), seed=2, dtype=jnp.bfloat16)
    got = frame_causal_attention(q, k, v, frame_tokens=9, block_q=8, block_k=8)
    assert got.dtype == jnp.bfloat16
    # One bf16 rounding of the fp32 result (2^-8 relative), on values below ~6.
    assert_close(got.astype(jnp.float32), frame_causal_attention_reference(q, k, v, frame_tokens=9).astype(
        jnp.float32), atol=0.05, label="bf16")


def test_memory_grows_linearly_in_tokens():
    # Compiled temporaries at 8 and 32 frames of 256 tokens: the dense mask alone would grow 16x.
    sizes = []
    for frames in (8, 32):
        spec = jax.ShapeDtypeStruct((1, frames * 256, 64), jnp.float32)
        compiled = jax.jit(lambda q, k, v: frame_causal_attention(q, k, v, frame_tokens=256, block_q=256,
                                                                  block_k=256)).lower(spec, spec, spec).compile()
        sizes.append(compiled.memory_analysis().temp_size_in_bytes)
    assert sizes[1] <= 4.5 * sizes[0]


def test_bad_shapes_are_refused():
    q, k, v = _qkv((1, 10, 4))
    with pytest.raises(ValueError, match="whole frames"):
        frame_causal_attention(q, k, v, frame_tokens=3)
    with pytest.raises(ValueError, match="alike"):
        frame_causal_attention(q, k[:, :5], v, frame_tokens=5)
