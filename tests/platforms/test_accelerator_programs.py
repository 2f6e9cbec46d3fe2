"""The CUDA and TPU programs, built and checked on a CPU: conv dtypes, layouts, sizes, accuracy.

JAX lowers a program for any platform without its hardware
(`TorchaxVAE.lower_decode(shape, platform=...)`), so what a GPU or TPU will
run is checked here from the lowered StableHLO. The GPU/TPU formulation's
numbers are checked by running the same patched module on the CPU.
"""

import math

import jax
import jax.numpy as jnp
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.platforms import hlo
from cogvideox_torchax.vae.program_cache import ProgramKey
from cogvideox_torchax.vae.torchax_vae import to_host_torch
from tests.support import stablehlo_rules as escapes
from tests.support.parity import assert_close, psnr
from tests.support.reference import seeded_latents, upstream_decode

_TINY = (1, 4, 5, 4, 4)  # first batch + one scan step; both upsamplers and every SpatialNorm


@pytest.fixture(scope="module")
def tiny_bf16(tiny_upstream):
    return ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1")


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_bf16_accelerator_programs_keep_bf16(tiny_bf16, platform):
    text = tiny_bf16.lower_decode(_TINY, platform=platform).as_text()
    convs = hlo.convolutions(text)
    assert len(convs) >= 10
    # Every convolution that touches an activation reads and writes bf16;
    # only SpatialNorm's 1x1x1 convs on the latent (16 -> C channels at
    # latent resolution) are fp32 on purpose.
    latent_res = [c for c in convs if c.input_dtype == "f32"]
    assert all(math.prod(c.input_shape) <= math.prod(_TINY) for c in latent_res), latent_res
    assert all(c.output_dtype == "bf16" for c in convs if c.input_dtype == "bf16")
    assert len(latent_res) < len(convs) / 2
    batch, _, frames, height, width = _TINY
    found = escapes.fp32_escapes(text, min_elements=batch * 8 * frames * (2 * height) * (2 * width))
    assert not found, "\n".join(found[:5])


def test_cpu_bf16_program_accumulates_the_bias_in_fp32(tiny_bf16):
    # The CPU plan differs: XLA:CPU fuses the fp32 epilogue, so it keeps one rounding.
    convs = hlo.convolutions(tiny_bf16.lower_decode(_TINY).as_text())
    assert any(c.input_dtype == "bf16" and c.output_dtype == "f32" for c in convs)


def test_layouts_per_platform(tiny_bf16):
    # CUDA and TPU programs are written channels-first (the CUDA compiler
    # keeps NCDHW, test_targets checks it), the CPU's channels-last; on both
    # the resamplers' convs are 3-D too, so there is no 2-D conv left.
    for platform in ("cuda", "tpu"):
        convs = hlo.convolutions(tiny_bf16.lower_decode(_TINY, platform=platform).as_text())
        assert not any(c.channels_last for c in convs), (platform, {c.input_layout for c in convs})
        assert all(len(c.input_shape) == 5 for c in convs), platform
    cpu = hlo.convolutions(tiny_bf16.lower_decode(_TINY).as_text())
    assert all(c.channels_last for c in cpu), {c.input_layout for c in cpu}


def test_the_mesh_platform_program_is_untouched_by_lowering_for_others(tiny_upstream, tiny_bf16):
    before = tiny_bf16.lower_decode(_TINY).as_text()
    tiny_bf16.lower_decode(_TINY, platform="cuda")
    assert tiny_bf16.lower_decode(_TINY).as_text() == before
    with pytest.raises(ValueError, match="platform must be one of"):
        tiny_bf16.lower_decode(_TINY, platform="opencl")


def test_encode_lowers_for_cuda_with_bf16_convs(tiny_bf16):
    convs = hlo.convolutions(tiny_bf16.lower_encode((1, 3, 9, 16, 16), platform="cuda").as_text())
    assert convs and not any(c.channels_last for c in convs)
    assert all(c.output_dtype == "bf16" for c in convs if c.input_dtype == "bf16")


@pytest.mark.parametrize("frames", [1, 9, 10])
def test_cuda_plan_encode_in_fp32_equals_upstream(tiny_upstream, frames):
    # The downsamplers as 3-D convs and frame-pair means (odd and even frame
    # counts, and one frame: nothing to average), run on a CPU in fp32.
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    x = seeded_latents((1, 3, frames, 16, 16), seed=frames)
    program = vae.programs.program(ProgramKey("cuda"))
    ours = to_host_torch(program.jits["encode"](vae.weights, jnp.asarray(x.numpy())))
    with torch.no_grad():
        reference = tiny_upstream._encode(x)
    assert_close(ours, reference, atol=1e-5, label=f"cuda plan encode fp32, {frames} frames")


@pytest.mark.parametrize("frames", [1, 2, 5])
def test_cuda_plan_in_fp32_equals_upstream(tiny_upstream, frames):
    # The CUDA plan's own patches (3-D upsampler convs on one-frame, odd and
    # even frame counts; the padded input behind the cache barrier), run on
    # a CPU in fp32: upstream's values to fp32 rounding (1e-5).
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    assert "resample_conv3d" in vae.plan_for("cuda").steps
    z = seeded_latents((1, 4, frames, 4, 4), seed=frames)
    program = vae.programs.program(ProgramKey("cuda"))
    ours = to_host_torch(program.jits["decode"](vae.weights, jnp.asarray(z.numpy())))
    assert_close(ours, upstream_decode(tiny_upstream, z), atol=1e-5, label=f"cuda plan fp32, {frames} frames")


# CogVideoX 1.5 at 81 and 161 frames of 768x1360 (latents 21 and 41 x 96x170):
# the last up block's 256->128 3x3x3 conv and its 1x1x1 shortcut, and the
# upsampler's 2-D conv, would read more than 2^31 elements per frame batch.
@pytest.mark.slow
@pytest.mark.parametrize("frames", [21, 41])
def test_cuda_program_has_no_convolution_of_2_31_elements(vae_15, frames):
    shape = (1, 16, frames, 96, 170)
    cuda = hlo.convolutions(vae_15.lower_decode(shape, platform="cuda").as_text())
    largest = max(c.max_elements for c in cuda)
    assert largest < 2**31, largest
    # The one-chip TPU program splits them too (for memory: plan.py); the CPU one keeps them whole.
    tpu = hlo.convolutions(vae_15.lower_decode(shape, platform="tpu").as_text())
    assert max(c.max_elements for c in tpu) < 2**31
    cpu = hlo.convolutions(vae_15.lower_decode(shape, platform="cpu").as_text())
    assert max(c.max_elements for c in cpu) >= 2**31 and len(cuda) > len(cpu)


@pytest.mark.slow
def test_cuda_program_lowers_for_frames_above_768x1360(vae_15):
    # 1080p: one frame of a 256-channel activation (530 M elements) is larger
    # than the time chunks' 2^28, so the upsamplers' and shortcuts' convs are
    # split along height too; every convolution stays within the chunk size
    # or, for the resnet convs of one output frame, below 2^31.
    from cogvideox_torchax.families.cogvideox.patches.time_chunks import CHUNK_ELEMENTS

    cuda = hlo.convolutions(vae_15.lower_decode((1, 16, 2, 135, 240), platform="cuda").as_text())
    assert max(c.max_elements for c in cuda) < 2**31
    frame = 256 * 1080 * 1920
    assert frame > CHUNK_ELEMENTS
    # Some convolution reads a strip of a frame: fewer rows than the frame has.
    assert any(c.input_shape[1] == 256 and c.input_shape[3] < 1080 for c in cuda if len(c.input_shape) == 5)


def test_split_convolutions_equal_upstream(tiny_upstream):
    # A split far below the GPU's, so the tiny decode is cut into pieces (in
    # time with the causal halo for the 3-D convs, along frames for the
    # upsamplers' 2-D convs); time taps off so causal convs use the conv kernel.
    limit = 100_000
    options = ct.RuntimeOptions(conv_split_elements=limit, time_tap_conv=False)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=options)
    shape = (1, 4, 3, 8, 8)
    convs = hlo.convolutions(vae.lower_decode(shape).as_text())
    assert max(c.max_elements for c in convs) <= limit
    unsplit = hlo.convolutions(ct.wrap(tiny_upstream, mesh="dp=1,tp=1").lower_decode(shape).as_text())
    assert max(c.max_elements for c in unsplit) > 2 * limit
    z = seeded_latents(shape, seed=4)
    assert_close(vae.decode(z).sample, upstream_decode(tiny_upstream, z), atol=1e-5, label="split convs fp32")


def test_cuda_plan_with_frames_above_its_split_size_equals_upstream(tiny_upstream):
    # The GPU plan's situation above 768x1360, scaled down: one frame of the
    # tiny config's last up block (8 x 64 x 64 = 32768 elements) is above the
    # split size, so its convolutions (time chunks, upsamplers, shortcuts)
    # are cut into strips of rows, with their halo, inside each frame.
    limit = 20_000
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(conv_split_elements=limit))
    shape = (1, 4, 3, 8, 8)
    convs = hlo.convolutions(vae.lower_decode(shape, platform="cuda").as_text())
    assert max(c.max_elements for c in convs) <= limit
    assert any(c.input_shape[3] < 64 for c in convs if len(c.input_shape) == 5 and c.input_shape[1] == 8)
    z = seeded_latents(shape, seed=6)
    assert_close(_decode_with_plan_of(vae, "cuda", z), upstream_decode(tiny_upstream, z), atol=2e-5,
                 label="cuda plan, frames split in rows, fp32")


def _decode_with_plan_of(vae, platform: str, z: torch.Tensor, kind: str = "decode") -> torch.Tensor:
    # The GPU/TPU program's patched module, run here on the CPU.
    program = vae.programs.program(ProgramKey(platform))
    return to_host_torch(program.jits[kind](vae.weights, jnp.asarray(z.float().numpy(), vae.options.jax_dtype)))


# The CUDA plan's convs add the bias in fp32 here, as cuDNN's fused epilogue
# does on the GPU (test_targets checks the fusion in the compiled program);
# the TPU plan adds it after the bf16 rounding, and SpatialNorm's fp32 scale
# and shift win that back. Measured, tiny config, (1,4,3,4,4), PSNR against
# the fp32 upstream decode, seeds 0, 1, 3: cuda plan +0.84 to +1.77 dB, tpu
# plan -0.29 to +0.65 dB against upstream torch's bf16 decode on the CPU
# (the same figures on two 2-core hosts of this kind).
@pytest.mark.parametrize("seed", [0, 1, 3])
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerator_bf16_psnr_within_half_a_db_of_torch(platform, seed):
    upstream = ct.random_upstream("tiny", seed=seed)
    z = seeded_latents((1, 4, 3, 4, 4), seed=seed)
    reference = upstream_decode(upstream, z)
    torch_bf16 = upstream_decode(upstream.to(torch.bfloat16), z.bfloat16())
    upstream.to(torch.float32)
    vae = ct.wrap(upstream, dtype="bfloat16", mesh="dp=1,tp=1")
    ours = _decode_with_plan_of(vae, platform, z)
    assert ours.dtype == torch.bfloat16 and jax.default_backend() == "cpu"
    ours_db, theirs_db = psnr(ours, reference), psnr(torch_bf16, reference)
    print(f"[psnr] {platform} plan, seed {seed}: ours {ours_db:.2f} dB, upstream bf16 {theirs_db:.2f} dB")
    assert ours_db >= theirs_db - 0.5


# fp16 with the bias in fp32 on every platform (platforms/run_plan.py): the CUDA
# and TPU plans' decodes equal the CPU plan's to the dB here, +0.18 to
# +1.91 dB above upstream torch's own fp16 decode on seeds 0-5 (tiny,
# (1,4,3,4,4)); the random seeds tested are 1.44 to 1.91 dB above.
@pytest.mark.parametrize("seed", [0, 1, 3])
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerator_fp16_psnr_within_half_a_db_of_torch(platform, seed):
    z = seeded_latents((1, 4, 3, 4, 4), seed=seed)
    reference = upstream_decode(ct.random_upstream("tiny", seed=seed), z)
    upstream = ct.random_upstream("tiny", seed=seed).to(torch.float16)
    torch_fp16 = upstream_decode(upstream, z.half())
    vae = ct.wrap(upstream, mesh="dp=1,tp=1")
    ours = _decode_with_plan_of(vae, platform, z)
    assert ours.dtype == torch.float16 and jax.default_backend() == "cpu"
    ours_db, theirs_db = psnr(ours, reference), psnr(torch_fp16, reference)
    print(f"[psnr] {platform} plan fp16, seed {seed}: ours {ours_db:.2f} dB, upstream fp16 {theirs_db:.2f} dB")
    assert ours_db >= theirs_db - 0.5


def test_cogvideox_15_preset():
    module = ct.random_upstream("cogvideox-1.5", seed=0)
    assert module.config.scaling_factor == 0.7 and module.config.invert_scale_latents is True
    assert (module.config.sample_height, module.config.sample_width) == (768, 1360)
    assert list(module.config.block_out_channels) == [128, 256, 256, 512]
