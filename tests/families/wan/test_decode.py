"""Wan decode parity with upstream eager PyTorch on the CPU: same weights (norms perturbed) and latents."""

import jax
import pytest
import torch

import cogvideox_torchax as ct
from tests.families.wan.conftest import perturbed
from tests.support.parity import assert_close, psnr
from tests.support.reference import seeded_latents, upstream_decode

_JAX = tuple(int(p) for p in jax.__version__.split(".")[:2])


# Frame counts: the first latent frame alone (1), one scan step (2), several
# (5, 13); odd and non-square latent sizes; a batch of two.
@pytest.mark.parametrize(
    "shape",
    [(1, 16, 1, 4, 4), (1, 16, 2, 3, 5), (1, 16, 5, 5, 3), (1, 16, 13, 2, 3), (2, 16, 2, 3, 3)],
)
def test_wan_tiny_fp32(wan_tiny_upstream, wan_tiny, shape):
    z = seeded_latents(shape, seed=shape[2])
    expected = upstream_decode(wan_tiny_upstream, z)
    got = wan_tiny.decode(z).sample
    assert got.shape == (shape[0], 3, 1 + 4 * (shape[2] - 1), 8 * shape[3], 8 * shape[4])
    # fp32: the largest seen here is 6e-7.
    assert_close(got, expected, atol=1e-5, label=f"wan-tiny fp32 {shape}")


@pytest.mark.parametrize("shape", [(1, 4, 1, 3, 3), (1, 4, 2, 2, 3), (1, 4, 5, 3, 2), (1, 4, 13, 1, 1)])
def test_wan22_tiny_fp32(wan22_tiny_upstream, wan22_tiny, shape):
    """Residual blocks, 2x2 patches and 16x compression (Wan 2.2 TI2V-5B's paths)."""
    z = seeded_latents(shape, seed=shape[2])
    expected = upstream_decode(wan22_tiny_upstream, z)
    got = wan22_tiny.decode(z).sample
    assert got.shape == (shape[0], 3, 1 + 4 * (shape[2] - 1), 16 * shape[3], 16 * shape[4])
    assert_close(got, expected, atol=1e-5, label=f"wan2.2-tiny fp32 {shape}")


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "shape"), [
    ("wan2.1", (1, 16, 2, 3, 5)), ("wan2.1", (1, 16, 5, 2, 3)),
    ("wan2.2-ti2v-5b", (1, 48, 2, 1, 3)),
])
def test_wan_real_configs_fp32(preset, shape):
    upstream = perturbed(ct.random_upstream(preset, seed=1), seed=1)
    z = seeded_latents(shape, seed=2)
    expected = upstream_decode(upstream, z)
    got = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1").decode(z).sample
    # The real widths (up to 384 and 1024 channels) sum more terms: 1e-4.
    assert_close(got, expected, atol=1e-4, label=f"{preset} fp32 {shape}")


def _psnrs(upstream, dtype, shape, seed):
    z = seeded_latents(shape, seed)
    reference = upstream_decode(upstream, z)
    low = getattr(torch, dtype)
    theirs = upstream_decode(upstream.to(low), z.to(low))
    upstream.to(torch.float32)
    ours = ct.wrap(upstream, dtype=dtype, mesh="dp=1,tp=1").decode(z).sample
    assert ours.dtype == low and torch.isfinite(ours).all()
    ours_db, theirs_db = psnr(ours, reference), psnr(theirs, reference)
    print(f"[psnr] {dtype} seed {seed} {shape}: ours {ours_db:.2f} dB, upstream torch {theirs_db:.2f} dB vs fp32")
    return ours_db, theirs_db


# Against upstream's fp32 decode: ours in bf16 and fp16 (fp32 statistics,
# accumulations and norms, one rounding per op) at least upstream torch's own
# in that dtype, less 0.5 dB.
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seed", [0, 1, 3])
def test_wan_tiny_low_precision_psnr(dtype, seed, request):
    if dtype == "float16" and seed == 1 and _JAX >= (0, 12):
        # wan-tiny's second up block norms ONE channel: its RMS norm is sign(x) * gain + bias. On jax 0.12
        # one input of 4.7e-5 (fp32) rounds to the other sign in fp16, a jump of twice the gain that the
        # caches carry on (29.9 dB against torch's 63.4; 63.3 dB on jax 0.10.2). An ill-posed tiny config,
        # not a defect of the decode: real configs norm 96 channels or more (docs/open-questions.md).
        request.applymarker(pytest.mark.xfail(reason="wan-tiny's one-channel RMS norm is a sign function: "
                                              "an fp16 rounding flips it on jax 0.12", strict=False))
    upstream = perturbed(ct.random_upstream("wan-tiny", seed=seed), seed)
    ours, theirs = _psnrs(upstream, dtype, (1, 16, 3, 4, 4), seed)
    assert ours >= theirs - 0.5


def test_bad_latents_name_the_channels(wan_tiny):
    with pytest.raises(ValueError, match="16 channels"):
        wan_tiny.decode(torch.zeros(1, 4, 2, 3, 3))
