"""diffusers' LTX-2 pipelines with the wrapped VAE, against the same pipeline with upstream's VAE.

Tiny and offline, as Wan's (tests/families/wan/test_pipelines.py): a
one-layer random `LTX2VideoTransformer3DModel`, the text connectors, a tiny
audio VAE and vocoder (the pipelines make sound too), the flow-matching
scheduler, the ltx2-tiny VAE with its statistics off (0, 1) (`perturbed`),
prompt embeddings passed directly (no text encoder or tokenizer). Guidance
off (one transformer call a step); same seeds on both sides. The video goes
through the VAE's decode (``output_type="pt"``): the pipeline denormalises
the latents by ``vae.latents_mean`` / ``vae.latents_std`` (read of the
wrapped VAE as host copies) and calls ``vae.decode(latents, timestep)``.
"""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.ltx2.conftest import CONDITIONED, upstream_of
from tests.support.parity import assert_close

pytest.importorskip("transformers", reason="diffusers' LTX-2 pipelines need transformers")

from diffusers import AutoencoderKLLTX2Video, LTX2ImageToVideoPipeline, LTX2Pipeline  # noqa: E402

from tests.support.pipelines import ltx2_embeddings, tiny_ltx2_components  # noqa: E402

# fp32, after the video processor's clamp to [0, 1]: the largest measured is 8.9e-7.
ATOL = 1e-4
TINY = preset_config("ltx2-tiny")


def _call(pipe, **kwargs):
    kwargs = {"output_type": "pt", **kwargs}
    return pipe(
        **ltx2_embeddings(),
        height=32,
        width=32,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=1.0,
        stg_scale=0.0,
        modality_scale=1.0,
        guidance_rescale=0.0,
        audio_guidance_scale=1.0,
        audio_stg_scale=0.0,
        audio_modality_scale=1.0,
        audio_guidance_rescale=0.0,
        spatio_temporal_guidance_blocks=None,
        max_sequence_length=8,
        generator=torch.Generator().manual_seed(0),
        **kwargs,
    )


def _compare(got, expected, label, audio_atol=0.0):
    assert got.frames.shape == (1, 9, 3, 32, 32) and float(expected.frames.std()) > 0.05  # a video, not a constant
    assert_close(got.frames, expected.frames, atol=ATOL, label=f"{label} frames")
    # Text to video: the sound never meets the video VAE, the same bits on both sides. Image to video: the
    # transformer's audio stream attends to the video latents, which hold the encoded image (measured 7.5e-8).
    assert_close(got.audio, expected.audio, atol=audio_atol, label=f"{label} audio")


def _assigned(cls, config, seed=0):
    pipe = cls(**tiny_ltx2_components(upstream_of(config, seed)))
    pipe.vae = ct.wrap(pipe.vae, mesh="dp=1,tp=1")
    assert isinstance(pipe.vae, ct.TorchaxVAE) and isinstance(pipe.vae, AutoencoderKLLTX2Video)
    return pipe


def _image():
    return torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(3))


def test_text_to_video_assigned_then_image_to_video_built_around_it():
    expected = _call(LTX2Pipeline(**tiny_ltx2_components(upstream_of(TINY))))
    pipe = _assigned(LTX2Pipeline, TINY)
    got = _call(pipe)
    _compare(got, expected, "LTX2Pipeline, vae assigned")
    # Its output_type="latent" returns the latents denormalised, as vae.decode takes them (the decode
    # command's --no-unscale), unlike the latents it holds before decoding (the command's default).
    latents = _call(pipe, output_type="latent").frames
    video = pipe.video_processor.postprocess_video(pipe.vae.decode(latents).sample, output_type="pt")
    assert_close(video, got.frames, atol=1e-6, label="output_type='latent' decoded as is")
    # Image to video built from its components, the wrapped VAE among them: the image is encoded (the
    # posterior's mode, normalised by the statistics) as the first latent frame, the denoised latents
    # decoded, both by our VAE.
    expected = _call(LTX2ImageToVideoPipeline(**tiny_ltx2_components(upstream_of(TINY))), image=_image(), image_crf=0)
    built = LTX2ImageToVideoPipeline(**pipe.components)
    assert built.vae is pipe.vae
    _compare(_call(built, image=_image(), image_crf=0), expected, "LTX2ImageToVideoPipeline, vae at construction",
             audio_atol=1e-5)
    assert pipe.vae.compiled_shapes("encode") and pipe.vae.compiled_shapes("decode")


def test_image_to_video_assigned_then_text_to_video_at_the_pipelines_decode_timestep():
    # A timestep-conditioned decoder: the pipelines mix noise into the latents and pass the decode
    # timestep to vae.decode(latents, timestep).
    at = {"decode_timestep": 0.05, "decode_noise_scale": 0.025}
    expected = _call(LTX2ImageToVideoPipeline(**tiny_ltx2_components(upstream_of(CONDITIONED, seed=1))),
                     image=_image(), image_crf=0, **at)
    pipe = _assigned(LTX2ImageToVideoPipeline, CONDITIONED, seed=1)
    _compare(_call(pipe, image=_image(), image_crf=0, **at), expected, "LTX2ImageToVideoPipeline at timestep 0.05",
             audio_atol=1e-5)
    expected = _call(LTX2Pipeline(**tiny_ltx2_components(upstream_of(CONDITIONED, seed=1))), **at)
    built = LTX2Pipeline(**pipe.components)
    got = _call(built, **at)
    _compare(got, expected, "LTX2Pipeline at timestep 0.05, vae at construction")
    # The timestep reaches the decoder: another one (the same noise) gives another video.
    other = _call(built, decode_timestep=0.5, decode_noise_scale=0.025)
    assert (other.frames - got.frames).abs().max() > 1e-3
