"""CogVideoX's decode against upstream eager PyTorch on the CPU (same weights and latents), its programs, its memory.

Parity in fp32, bf16 and fp16; the whole bf16 decode lowered, with no
activation-sized fp32 value outside a fused computation; and the compiled
decode's memory when frame batches chain (compile only, real 2b config).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import cogvideox_torchax as ct
from tests.support import stablehlo_rules as hlo
from tests.support.cpu_codegen import with_flags
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


# The whole bf16 decode, lowered: no activation-sized fp32 value outside a fused computation.


def _escapes(options):
    vae = ct.wrap(ct.random_upstream("tiny", seed=0), mesh="dp=1,tp=1", options=options)
    shape = (1, 4, 5, 4, 4)  # first batch + one scan step; both upsamplers and every SpatialNorm
    text = vae.lower_decode(shape).as_text()
    assert "xbf16>" in text
    # Full-size means at least an activation after the first 2x upsampling
    # (8 channels here): anything fp32 that big must be inside a reduction
    # or an elementwise chain cast back to bf16. Latent-resolution fp32
    # values are allowed: SpatialNorm's scale and shift are computed in fp32
    # from the latent on purpose (spatial_norm.LowResSpatialNorm3D).
    batch, _, frames, height, width = shape
    return hlo.fp32_escapes(text, min_elements=batch * 8 * frames * (2 * height) * (2 * width))


def test_bf16_decode_keeps_no_full_size_fp32():
    escapes = _escapes(ct.RuntimeOptions(dtype="bfloat16"))
    assert not escapes, "activation-sized f32 values escape a fused computation:\n" + "\n".join(escapes[:10])


def test_the_check_sees_torchax_interpolation_upcast():
    # Without our nearest kernel, torchax's fallback gathers from an fp32
    # copy of each upsampled activation; the check must say so.
    escapes = _escapes(ct.RuntimeOptions(dtype="bfloat16", nearest_upsample=False))
    assert any("gather" in e for e in escapes), escapes[:5]


# The compiled decode's memory when frame batches chain (compile only, real 2b config, small frames).
#
# The decode of 5 latent frames chains two decoder calls through the causal
# conv cache. Before `causal_conv.CacheFirstCausalConv3d`, XLA scheduled the cache
# slices late and kept the first call's full-size activations alive: at
# (1,16,5,16,16) the compiled temp was 4.8 GiB against 0.57 GiB for one call
# (3 frames); 92 GiB against 12.7 GiB at 480x720 (now 16.9 GiB at 13 frames). Measured with XLA:CPU's
# memory-aware scheduler, which must be set before JAX starts: own process.

SCRIPT = """
import json
import cogvideox_torchax as ct
vae = ct.wrap(ct.random_upstream("cogvideox-2b"), mesh="dp=1,tp=1")
temps = {t: vae.compile_decode((1, 16, t, 16, 16)).memory_analysis().temp_size_in_bytes for t in (3, 5)}
print(json.dumps(temps))
"""


@pytest.mark.slow  # real 2b config: ~20 s of compiling, still in the default run
def test_chained_batches_cost_a_few_decoder_calls_not_eight():
    env = dict(os.environ, XLA_FLAGS=with_flags("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    temps = {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    gib = {t: round(v / 2**30, 3) for t, v in temps.items()}
    print(f"[memory] 2b compiled temp GiB, latents (1,16,T,16,16), by latent frames: {gib}")
    # Measured (jax 0.10.2, channels-last convs on CPU): T=3 0.571 GiB,
    # T=5 1.24 GiB (T=13: 0.80); with cache_first=False T=5 is 4.80 GiB.
    # XLA's scheduler moves these by tens of percent between versions; the
    # bound separates the fixed program from the regression by 2x each way.
    assert temps[5] <= 3 * temps[3]
