"""Encode parity with upstream eager PyTorch on CPU, same weights and videos.

Upstream encodes frames in batches of 8 with the remainder in the first
batch (9 -> 9, 17 -> 9 + 8), each batch compressing time by 4 (an odd count
keeps its first frame apart); the batches after the first run as one scan
(`cogvideox_torchax.families.cogvideox.patches.frame_scan`). Every count
is compared, 4k+1 or not: whatever upstream makes of it is the reference.
"""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.families.cogvideox.patches import causal_conv
from tests.support.parity import assert_close

# fp32: the largest error seen on these shapes is 6.2e-6 (2b, (1,3,9,32,32));
# tiny stays under 2e-6. The bound asked of the encode is 1e-4 on .mode().
ATOL = 1e-4


def _video(shape, seed=1):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def upstream_posterior(module, x):
    with torch.no_grad():
        return module.encode(x).latent_dist


@pytest.mark.parametrize(
    "shape",
    [
        (1, 3, 1, 16, 16),  # one frame (an image, as the image-to-video pipeline encodes)
        (1, 3, 5, 16, 16),
        (1, 3, 9, 8, 24),  # non-square
        (1, 3, 13, 16, 16),
        (1, 3, 6, 12, 20),  # not 4k+1, sizes not multiples of 8
        (2, 3, 17, 16, 8),  # batch 2, two frame batches (9 + 8): first batch + one scan step
        (1, 3, 33, 8, 8),  # 9 + 8 x 3: a scan of three steps
        (1, 3, 20, 8, 8),  # 12 + 8: the first batch takes the remainder of 4
    ],
)
def test_tiny_fp32(tiny_upstream, tiny_vae, shape):
    x = _video(shape)
    expected = upstream_posterior(tiny_upstream, x)
    got = tiny_vae.encode(x).latent_dist
    assert got.mode().device.type == "cpu"
    assert_close(got.mode(), expected.mode(), atol=ATOL, label=f"tiny mode {shape}")
    assert_close(got.logvar, expected.logvar, atol=ATOL, label=f"tiny logvar {shape}")


def test_posterior_is_upstreams(tiny_upstream, tiny_vae):
    x = _video((1, 3, 9, 16, 16), seed=2)
    expected = upstream_posterior(tiny_upstream, x)
    (got,) = tiny_vae.encode(x, return_dict=False)
    assert type(got) is type(expected)
    assert_close(got.mean, expected.mean, atol=ATOL, label="mean")
    assert_close(got.std, expected.std, atol=ATOL, label="std")
    # The same generator state draws the same noise: sample() is upstream's.
    sample = got.sample(generator=torch.Generator().manual_seed(7))
    assert_close(sample, expected.sample(generator=torch.Generator().manual_seed(7)), atol=ATOL, label="sample")


def test_encode_jax_returns_moments(tiny_upstream, tiny_vae):
    x = _video((1, 3, 5, 8, 8), seed=3)
    moments = tiny_vae.encode_jax(x)
    assert moments.shape == (1, 8, 2, 1, 1)  # mean and logvar of 4 channels
    assert_close(moments, upstream_posterior(tiny_upstream, x).parameters, atol=ATOL, label="moments")


def test_tiled_encode_matches_upstream():
    # 32-pixel tiles stepping by 24 over 40x40: a 2x2 grid, edge tiles cut short.
    tiles = dict(tile_sample_min_height=32, tile_sample_min_width=32)
    upstream = ct.random_upstream("tiny", seed=2)
    upstream.enable_tiling(**tiles, tile_overlap_factor_height=0.25, tile_overlap_factor_width=0.25)
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    vae.enable_tiling(**tiles, tile_overlap_factor_height=0.25, tile_overlap_factor_width=0.25)
    x = _video((1, 3, 5, 40, 40), seed=4)
    got = vae.encode(x).latent_dist.mode()
    assert_close(got, upstream_posterior(upstream, x).mode(), atol=ATOL, label="tiled (1,3,5,40,40)")


@pytest.mark.parametrize(
    "shape,match", [((1, 3, 2, 4), "B, C, F, H, W"), ((1, 4, 1, 8, 8), "3 channels"), ((1, 3, 0, 8, 8), "empty")]
)
def test_bad_videos_are_named(tiny_vae, shape, match):
    with pytest.raises(ValueError, match=match):
        tiny_vae.encode(torch.zeros(shape))


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 3, 5, 16, 16), (1, 3, 9, 32, 32)])
def test_cogvideox_2b_fp32(upstream_2b, shape):
    vae = ct.wrap(upstream_2b, dtype="float32", mesh="dp=1,tp=1")
    x = _video(shape)
    expected = upstream_posterior(upstream_2b, x)
    got = vae.encode(x).latent_dist
    assert_close(got.mode(), expected.mode(), atol=ATOL, label=f"2b mode {shape}")
    assert_close(got.logvar, expected.logvar, atol=ATOL, label=f"2b logvar {shape}")


def test_encode_program_does_not_grow_with_length(tiny_upstream, tiny_vae):
    # From two frame batches on, the batches after the first are one scan:
    # the same program whatever the length, only the trip count differs.
    lines = {f: len(tiny_vae.lower_encode((1, 3, f, 8, 8)).as_text().splitlines()) for f in (17, 49, 161)}
    assert lines[17] == lines[49] == lines[161], lines
    unrolled = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(frame_scan=False))
    grown = {f: len(unrolled.lower_encode((1, 3, f, 8, 8)).as_text().splitlines()) for f in (17, 49)}
    assert grown[49] > grown[17] + 100, grown  # upstream's loop unrolled: one encoder call per batch


def test_scan_carries_small_caches(tiny_vae):
    # What the encode's scan keeps through the loop (so the encode stays
    # flat in length): conv_in's cache as its 3 input channels, not the fp32
    # partial sums of its 8 output channels (128 in the 2b model: 0.33 GiB
    # at 480x720), and no batch-major copy of the later frames beside the
    # input video (each step slices its own batch).
    text = tiny_vae.lower_encode((1, 3, 25, 24, 40)).as_text()
    (loop,) = [line for line in text.splitlines() if "stablehlo.while" in line]
    carried = loop.rsplit(" : ", 1)[1]
    assert "tensor<1x3x2x24x40xf32>" in carried  # conv_in: upstream's cache, its last 2 input frames
    assert "tensor<1x2x24x40x8xf32>" in carried  # the other full-size convs: partial sums, as before
    assert "2x1x3x8x24x40" not in text  # the 2 later batches of 8 frames, batch-major


def test_encoder_convs_add_in_order(tiny_upstream, tiny_vae):
    # The encoder's convs add each tap's product before the next tap is
    # computed (`in_order`); left free, XLA:CPU's default scheduler keeps two
    # full-size products alive at once (2b, 49 frames at 480x720: 10.26
    # GiB of compiled temp with it, 11.25 without).
    def temp(vae):
        return vae.lower_encode((1, 3, 17, 64, 64)).compile(compiler_options=vae.compiler_options).memory_analysis()

    convs = [m for m in tiny_vae.module.encoder.modules() if isinstance(m, causal_conv.TimeTapCausalConv3d)]
    assert convs and all(m.in_order for m in convs)
    free = ct.wrap(tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
    for m in free.module.encoder.modules():
        if isinstance(m, causal_conv.TimeTapCausalConv3d):
            m.in_order = False
    assert temp(tiny_vae).temp_size_in_bytes < temp(free).temp_size_in_bytes


# fp16 encode, judged as the decode is: PSNR of the moments (mean and
# log-variance) against upstream's fp32 encode, beside upstream torch's own
# fp16 encode (eager, CPU). Every op rounds once as torch's do (the kernels
# equal torch's fp16 results to the last bit), but the encoder has no fp32
# SpatialNorm to gain from, so ours and torch's are level and a seed's
# figure is partly luck: at (1,3,9,16,16), 96 moments, ours was -2.8 to
# +3.6 dB off torch's. At (1,3,9,128,128), 6144 moments, seeds 0-5: ours
# 71.56 / 72.09 / 73.86 / 72.61 / 70.33 / 74.68 dB, torch 71.82 / 72.12 /
# 74.07 / 72.79 / 70.65 / 74.47 dB (-0.32 to +0.21, mean -0.13); the TPU
# plan's program (run here) the same to the dB. Hence the bound on the
# mean over seeds (0.5 dB) and 1 dB per seed for the luck.
def test_tiny_fp16_encode_psnr_level_with_torch():
    from cogvideox_torchax.vae.program_cache import ProgramKey
    from cogvideox_torchax.vae.torchax_vae import to_host_torch
    from tests.support.parity import psnr

    ours_db, tpu_db, theirs_db = [], [], []
    for seed in range(6):
        x = _video((1, 3, 9, 128, 128), seed=seed)
        reference = upstream_posterior(ct.random_upstream("tiny", seed=seed), x).parameters
        upstream = ct.random_upstream("tiny", seed=seed).to(torch.float16)
        theirs = upstream_posterior(upstream, x.half()).parameters
        vae = ct.wrap(upstream, mesh="dp=1,tp=1")
        ours = vae.encode(x.half()).latent_dist.parameters
        tpu = vae.programs.program(ProgramKey("tpu")).jits["encode"](vae.weights, x.half().numpy())
        tpu = to_host_torch(tpu)
        assert ours.dtype == tpu.dtype == torch.float16 and torch.isfinite(ours).all()
        ours_db.append(psnr(ours, reference))
        tpu_db.append(psnr(tpu, reference))
        theirs_db.append(psnr(theirs, reference))
        print(f"[psnr] encode seed {seed}: ours fp16 {ours_db[-1]:.2f} dB, tpu plan {tpu_db[-1]:.2f} dB, "
              f"upstream fp16 {theirs_db[-1]:.2f} dB vs fp32")
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    for db in (ours_db, tpu_db):
        assert mean(db) >= mean(theirs_db) - 0.5
        assert all(o >= t - 1.0 for o, t in zip(db, theirs_db, strict=True))
