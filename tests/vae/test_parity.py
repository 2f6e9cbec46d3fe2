"""Decode parity with upstream eager PyTorch on CPU, same weights and latents."""

import os

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close, psnr
from tests.support.reference import upstream_decode


def _latents(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# Frame counts exercise upstream's batching: 1 alone, even counts in pairs,
# odd counts with the remainder in the first batch (13 -> 3 + 5 x 2). From 4
# frames on, the batches after the first run as one scan (frame_scan.py).
@pytest.mark.parametrize(
    "shape",
    [
        (1, 4, 1, 4, 4),
        (1, 4, 2, 4, 4),
        (1, 4, 3, 4, 4),
        (1, 4, 4, 4, 4),
        (1, 4, 5, 4, 4),
        (1, 4, 9, 2, 3),
        (1, 4, 13, 2, 2),
        (2, 4, 3, 4, 4),  # batch 2
        (1, 4, 3, 3, 7),  # non-square, odd sizes
        (2, 4, 2, 5, 2),
    ],
)
def test_tiny_fp32(tiny_upstream, tiny_vae, shape):
    z = _latents(shape)
    expected = upstream_decode(tiny_upstream, z)
    got = tiny_vae.decode(z).sample
    assert got.device.type == "cpu"
    # fp32 "about 1e-5": the largest seen here is 9e-6 (batch 2).
    assert_close(got, expected, atol=2e-5, label=f"tiny fp32 {shape}")


def test_return_dict_false_and_attributes(tiny_upstream, tiny_vae):
    z = _latents((1, 4, 2, 3, 3))
    (sample,) = tiny_vae.decode(z, return_dict=False)
    assert_close(sample, upstream_decode(tiny_upstream, z), atol=1e-5, label="return_dict=False")
    assert tiny_vae.dtype == torch.float32
    assert tiny_vae.config.latent_channels == 4
    assert tiny_vae.config == tiny_upstream.config


@pytest.mark.parametrize(
    "shape,match", [((1, 4, 2, 4), "B, C, T, H, W"), ((1, 3, 2, 4, 4), "4 channels"), ((1, 4, 0, 4, 4), "empty")]
)
def test_bad_latents_are_named(tiny_vae, shape, match):
    with pytest.raises(ValueError, match=match):
        tiny_vae.decode(torch.zeros(shape))


@pytest.mark.slow
@pytest.mark.parametrize("frames", [1, 2, 3, 5])
def test_cogvideox_2b_fp32(upstream_2b, reference_2b, frames):
    vae = ct.wrap(upstream_2b, dtype="float32", mesh="dp=1,tp=1")
    z, expected = reference_2b(frames)
    assert_close(vae.decode(z).sample, expected, atol=1e-4, label=f"2b fp32 T={frames}")


def _bf16_psnrs(upstream, shape, seed=0):
    z = _latents(shape, seed)
    reference = upstream_decode(upstream, z)
    upstream_bf16 = upstream_decode(upstream.to(torch.bfloat16), z.bfloat16())
    upstream.to(torch.float32)
    ours = ct.wrap(upstream, dtype="bfloat16", mesh="dp=1,tp=1").decode(z).sample
    assert ours.dtype == torch.bfloat16
    ours_db, theirs_db = psnr(ours, reference), psnr(upstream_bf16, reference)
    print(f"[psnr] {shape}: ours bf16 {ours_db:.2f} dB, upstream bf16 {theirs_db:.2f} dB vs fp32")
    return ours_db, theirs_db


# Several seeds: before the conv-bias and GroupNorm single-rounding fixes,
# seed 0 passed by 0.08 dB while seed 3 was 3.1 dB below upstream. Now ours
# is 0.45 to 1.5 dB above upstream's bf16 on seeds 0-5.
@pytest.mark.parametrize("seed", [0, 1, 3])
def test_tiny_bf16_psnr(seed):
    ours, theirs = _bf16_psnrs(ct.random_upstream("tiny", seed=seed), (1, 4, 3, 4, 4), seed=seed)
    assert ours >= theirs - 0.5


# fp16, as CogVideoX-2b is published (torch_dtype=torch.float16): wrap takes
# the float16 module's dtype. Against the fp32 decode, tiny config, (1,4,3,4,4),
# seeds 0-5: ours 79.55 / 85.32 / 83.07 / 84.31 / 84.23 / 81.13 dB, upstream
# torch's own fp16 (eager, CPU) 78.11 / 83.63 / 82.89 / 82.40 / 83.23 / 80.29 dB:
# +0.18 to +1.91 dB, SpatialNorm's fp32 scale and shift again. The seeds
# tested are 1.44 to 1.91 dB above torch, leaving room for torch's fp16
# differing between hosts; the floor is ours alone (no torch low precision):
# 78.0 dB, 1.5 below the lowest of them.
@pytest.mark.parametrize("seed", [0, 1, 3])
def test_tiny_fp16_psnr(seed):
    z = _latents((1, 4, 3, 4, 4), seed)
    reference = upstream_decode(ct.random_upstream("tiny", seed=seed), z)
    upstream = ct.random_upstream("tiny", seed=seed).to(torch.float16)
    theirs = upstream_decode(upstream, z.half())
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    assert vae.dtype == torch.float16 and vae.plan.placement.dtype == "float16"
    ours = vae.decode(z.half()).sample
    assert ours.dtype == torch.float16 and torch.isfinite(ours).all()
    ours_db, theirs_db = psnr(ours, reference), psnr(theirs, reference)
    print(f"[psnr] seed {seed}: ours fp16 {ours_db:.2f} dB, upstream fp16 {theirs_db:.2f} dB vs fp32")
    assert ours_db >= theirs_db - 0.5
    assert ours_db >= 78.0


@pytest.mark.skipif(
    os.environ.get("COGVIDEOX_TORCHAX_SLOW") != "1",
    reason="upstream eager bf16 Conv3d on a CPU takes > 5 min even at (1,16,2,4,4); set COGVIDEOX_TORCHAX_SLOW=1",
)
def test_cogvideox_2b_bf16_psnr():
    ours, theirs = _bf16_psnrs(ct.random_upstream("cogvideox-2b", seed=0), (1, 16, 2, 4, 4))
    assert ours >= theirs - 0.5
