"""diffusers' `Kandinsky6TI2VAPipeline` (text/image to video and audio) with the wrapped `AutoencoderKLHunyuanVideo`,
against the same pipeline with upstream's VAE.

Covered: text to video-and-audio and image to video-and-audio (the reference image is encoded by the VAE), each
with classifier-free guidance, with the wrapped VAE assigned to `pipe.vae` and passed at construction. Only the
video frames go through our VAE and are compared; the audio path (`MMAudioVAE` decode, `MMAudioVocoder`) runs as
upstream's does on both sides and is only checked for shape and finiteness.

Tiny and offline: a random two-block `Kandinsky6Transformer3DModel`, tiny random `MMAudioVAE` and `MMAudioVocoder`
(diffusers' own pipeline-test configs), the flow-matching scheduler, the hunyuanvideo-tiny VAE, prompt and negative
prompt embeddings passed directly (no Qwen2.5-VL or CLIP text encoders). Same seeds on both sides; one wrapped VAE.
"""

import numpy as np
import pytest
import torch
from PIL import Image

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.hunyuan.conftest import upstream_of
from tests.support.parity import assert_close

pytest.importorskip("transformers", reason="diffusers' Kandinsky 6 pipeline needs transformers")

from diffusers import (  # noqa: E402
    AutoencoderKLHunyuanVideo,
    FlowMatchEulerDiscreteScheduler,
    Kandinsky6TI2VAPipeline,
    Kandinsky6Transformer3DModel,
    MMAudioVAE,
    MMAudioVocoder,
)

# fp32, after the video processor's clamp to [0, 1].
ATOL = 1e-4
TINY = preset_config("hunyuanvideo-tiny")
QWEN_DIM, CLIP_DIM, TEXT_LEN = 16, 8, 6
# 9 frames: 3 latent frames at 24 fps; the 64 Hz tiny audio VAE gives 3 audio latent frames -> 24 samples.
COMMON = dict(height=16, width=16, num_frames=9, num_inference_steps=2, guidance_scale=5.0, output_type="pt")


def _seeded(build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


def _components(vae):
    # `visual_cond` and two token types: the same transformer takes the text-only and the image-conditioned calls.
    transformer = _seeded(lambda: Kandinsky6Transformer3DModel(
        in_visual_dim=4, out_visual_dim=4, in_text_dim=QWEN_DIM, in_text_dim2=CLIP_DIM, time_dim=16,
        patch_size=(1, 2, 2), model_dim=12, ff_dim=24, num_text_blocks=1, num_visual_blocks=2, axes_dims=(2, 1, 1),
        visual_cond=True, in_audio_dim=4, out_audio_dim=4, visual_token_type_num_embeddings=2,
    ))
    audio_vae = _seeded(lambda: MMAudioVAE(
        mel_bins=8, latent_channels=4, hidden_channels=8, channel_multipliers=(1, 2), layers_per_block=1,
        sample_rate=64, n_fft=16, hop_length=4,
    ))
    # `upsample_rates` multiply to the audio VAE's `hop_length`.
    vocoder = _seeded(lambda: MMAudioVocoder(
        num_mels=8, upsample_initial_channel=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4),
        resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),),
    ))
    return dict(transformer=transformer, vae=vae, text_encoder=None, tokenizer=None, text_encoder_2=None,
                tokenizer_2=None, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), audio_vae=audio_vae,
                vocoder=vocoder)


def _embeddings():
    g = torch.Generator().manual_seed(1)
    return dict(prompt_embeds=torch.randn((1, TEXT_LEN, QWEN_DIM), generator=g),
                pooled_prompt_embeds=torch.randn((1, CLIP_DIM), generator=g),
                negative_prompt_embeds=torch.randn((1, TEXT_LEN, QWEN_DIM), generator=g),
                negative_pooled_prompt_embeds=torch.randn((1, CLIP_DIM), generator=g))


def _image(size):
    """A seeded random RGB image: image to video encodes it with the VAE."""
    return Image.fromarray(np.random.default_rng(2).integers(0, 256, (size, size, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def vaes():
    """(upstream's tiny VAE, a copy of it wrapped): the same weights."""
    return upstream_of(TINY, seed=1), ct.wrap(upstream_of(TINY, seed=1), mesh="dp=1,tp=1")


@pytest.mark.parametrize("image", [False, True], ids=["t2va", "i2va"])
def test_kandinsky6_ti2va(vaes, image):
    upstream, wrapped = vaes
    call = dict(**(dict(image=_image(16)) if image else {}), **_embeddings(), **COMMON)
    label = f"Kandinsky6TI2VAPipeline {'i2va' if image else 't2va'}"

    def run(pipe):
        out = pipe(generator=torch.Generator().manual_seed(0), **call)
        assert out.audio.shape == (1, 24) and bool(torch.isfinite(out.audio).all())
        return out.frames

    expected = run(Kandinsky6TI2VAPipeline(**_components(upstream)))
    assert expected.shape == (1, 9, 3, 16, 16) and float(expected.std()) > 0.05
    pipe = Kandinsky6TI2VAPipeline(**_components(upstream))
    pipe.vae = wrapped
    assert isinstance(pipe.vae, ct.TorchaxVAE) and isinstance(pipe.vae, AutoencoderKLHunyuanVideo)
    assert_close(run(pipe), expected, atol=ATOL, label=f"{label}, assigned")
    assert_close(run(Kandinsky6TI2VAPipeline(**_components(wrapped))), expected, atol=ATOL, label=f"{label}, built")
