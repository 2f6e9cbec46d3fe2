"""LTX-2 decode parity with upstream eager PyTorch on the CPU (same weights and latents), and a flat compile time."""

import inspect

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from cogvideox_torchax.platforms import hlo
from tests.families.ltx2.conftest import CAUSAL, CONDITIONED, perturbed, upstream_of
from tests.support.parity import assert_close, psnr
from tests.support.reference import seeded_latents, upstream_decode


def _frames(latent_frames: int) -> int:
    return 1 + 8 * (latent_frames - 1)


# One latent frame (the causal padding's edge alone), two, five; odd and
# non-square latent sizes; a batch of two.
@pytest.mark.parametrize("shape", [(1, 8, 1, 3, 3), (1, 8, 2, 3, 5), (1, 8, 5, 5, 2), (2, 8, 2, 2, 3)])
def test_ltx2_tiny_fp32(ltx2_tiny_upstream, ltx2_tiny, shape):
    z = seeded_latents(shape, seed=shape[2])
    expected = upstream_decode(ltx2_tiny_upstream, z)
    got = ltx2_tiny.decode(z).sample
    assert got.shape == (shape[0], 3, _frames(shape[2]), 8 * shape[3], 8 * shape[4])
    # fp32: the largest seen here is 2e-6 (the decoder's outputs reach ~40).
    assert_close(got, expected, atol=1e-4, label=f"ltx2-tiny fp32 {shape}")


@pytest.mark.parametrize("shape", [(1, 8, 1, 2, 3), (1, 8, 5, 3, 2)])
def test_ltx2_tiny_causal_decoder_fp32(shape):
    upstream = upstream_of(CAUSAL, seed=3)
    z = seeded_latents(shape, seed=shape[2])
    got = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1").decode(z).sample
    assert_close(got, upstream_decode(upstream, z), atol=1e-4, label=f"ltx2-tiny causal fp32 {shape}")


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "shape"), [("ltx2", (1, 128, 2, 2, 3)), ("ltx2.3", (1, 128, 2, 1, 2))])
def test_ltx2_real_configs_fp32(preset, shape):
    upstream = perturbed(ct.random_upstream(preset, seed=1), seed=1)
    z = seeded_latents(shape, seed=2)
    expected = upstream_decode(upstream, z)
    got = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1").decode(z).sample
    # The real widths (1024 channels at the latent size) sum more terms: 1e-4.
    assert_close(got, expected, atol=1e-4, label=f"{preset} fp32 {shape}")


# Against upstream's fp32 decode: ours in bf16 at least upstream torch's own bf16, less 0.5 dB.
@pytest.mark.parametrize("seed", [0, 1])
def test_ltx2_tiny_bf16_psnr(seed):
    upstream = upstream_of(preset_config("ltx2-tiny"), seed=seed)
    z = seeded_latents((1, 8, 3, 4, 4), seed)
    reference = upstream_decode(upstream, z)
    theirs = upstream_decode(upstream.to(torch.bfloat16), z.to(torch.bfloat16))
    upstream.to(torch.float32)
    ours = ct.wrap(upstream, dtype="bfloat16", mesh="dp=1,tp=1").decode(z).sample
    assert ours.dtype == torch.bfloat16 and torch.isfinite(ours).all()
    ours_db, theirs_db = psnr(ours, reference), psnr(theirs, reference)
    print(f"[psnr] bf16 seed {seed}: ours {ours_db:.2f} dB, upstream torch {theirs_db:.2f} dB vs fp32")
    assert ours_db >= theirs_db - 0.5


def test_compile_time_does_not_grow_with_the_video(ltx2_tiny):
    # Upstream decodes the whole video in one call: one program whose size does
    # not depend on the frame count, so neither does its compile time. Judged on
    # the programs themselves (a timed check would fail on a busy machine).
    def instructions(text: str) -> list[str]:
        return [line for line in text.splitlines() if " = " in line and not line.lstrip().startswith("//")]

    text5 = ltx2_tiny.lower_decode((1, 8, 5, 2, 2)).as_text()
    text17 = ltx2_tiny.lower_decode((1, 8, 17, 2, 2)).as_text()
    assert abs(len(text17) - len(text5)) < 0.01 * len(text5)  # the same traced program, other shapes
    compiled = [ltx2_tiny.compile_decode((1, 8, t, 2, 2)).as_text() for t in (5, 17)]
    five, seventeen = (instructions(text) for text in compiled)
    print(f"[compile] optimized instructions: 5 latent frames {len(five)}, 17: {len(seventeen)}")
    # And the same compiled one. Fusion varies a little with the shapes: 558 and 541 instructions with the
    # CPU's convolutions run by the host's torch (a fusion, a reduce-window, constants; nothing per frame).
    assert abs(len(seventeen) - len(five)) <= 0.04 * len(five)
    convolutions = [hlo.executed_summary(text)["convolution_calls"] for text in compiled]
    assert convolutions[0] == convolutions[1] > 0


def test_bad_latents_name_the_channels(ltx2_tiny):
    with pytest.raises(ValueError, match="8 channels"):
        ltx2_tiny.decode(torch.zeros(1, 16, 2, 3, 3))


def test_a_timestep_conditioned_decoder_takes_the_decode_timestep_as_upstream():
    # As LTX2Pipeline calls it: vae.decode(latents, timestep, return_dict=False), one timestep per video.
    upstream = upstream_of(CONDITIONED, seed=2)
    vae = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1")
    z, temb = seeded_latents((2, 8, 2, 3, 3), seed=1), torch.tensor([0.05, 0.3])
    with torch.no_grad():
        expected = upstream.decode(z, temb).sample
        at_zero = upstream.decode(z, torch.zeros(2)).sample
    assert_close(vae.decode(z, temb, return_dict=False)[0], expected, atol=1e-4, label="ltx2-tiny conditioned")
    # Left out, the timestep is LTX2Pipeline's default decode_timestep, 0.
    assert_close(vae.decode(z).sample, at_zero, atol=1e-4, label="ltx2-tiny conditioned, timestep 0")
    chunks = list(vae.decode_stream(z, temb=temb, output="video"))
    assert len(chunks) == 1  # the whole video in one batch, as upstream decodes it
    assert_close(chunks[0].data, expected, atol=1e-4, label="ltx2-tiny conditioned, streamed")
    # Three timesteps for two videos: upstream's broadcast refuses them, and so do we (its type, and a ValueError).
    with pytest.raises(RuntimeError, match="as upstream does") as refused:
        vae.decode(z, torch.tensor([0.1, 0.2, 0.3]))
    assert isinstance(refused.value, ValueError)


def test_a_causal_pass_of_a_non_causal_decoder_is_refused_naming_the_config_key(ltx2_tiny):
    z = seeded_latents((1, 8, 2, 2, 2), seed=0)
    with pytest.raises(ValueError, match="decoder_causal=True"):
        ltx2_tiny.decode(z, causal=True)
    with pytest.raises(ValueError, match="decoder_causal=True"):
        ltx2_tiny(torch.zeros(1, 3, 9, 16, 16), decoder_causal=True)
    with pytest.raises(TypeError, match="timestep"):
        ltx2_tiny.decode(z, timestep=0.5)  # upstream's own TypeError for an argument it does not take
    assert list(inspect.signature(ltx2_tiny.decode).parameters)[:3] == ["z", "temb", "causal"]


def test_the_latent_statistics_read_as_upstreams_buffers(ltx2_tiny_upstream, ltx2_tiny):
    # LTX2Pipeline normalises latents by vae.latents_mean / latents_std: host copies of the weights.
    for name in ("latents_mean", "latents_std"):
        got = getattr(ltx2_tiny, name)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        assert_close(got, getattr(ltx2_tiny_upstream, name), atol=0, label=name)
    assert not hasattr(ltx2_tiny, "encoder")  # other tensors and submodules stay refused


def test_noise_injection_is_drawn_as_upstream_draws_it():
    # Neither release injects noise, but upstream's LTX-2 decoder can (decoder_inject_noise): from the same
    # generator state, the same video, and the generator left where upstream leaves it.
    upstream = upstream_of({**CONDITIONED, "decoder_inject_noise": [True, True, False, True]}, seed=4)
    vae = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1")
    assert vae.family.draws_noise(vae.config)
    z, temb = seeded_latents((1, 8, 2, 3, 2), seed=5), torch.tensor([0.2])
    torch.manual_seed(6)
    with torch.no_grad():
        expected = upstream.decode(z, temb).sample
    after_upstream = torch.randn(3)
    torch.manual_seed(6)
    got = vae.decode(z, temb).sample
    assert torch.equal(torch.randn(3), after_upstream)
    assert_close(got, expected, atol=1e-4, label="ltx2-tiny with noise")
    assert (vae.decode(z, temb).sample - expected).abs().max() > 1e-2  # the next draws: another video
