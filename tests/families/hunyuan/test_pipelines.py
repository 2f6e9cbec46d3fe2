"""diffusers' pipelines built on `AutoencoderKLHunyuanVideo`, with the wrapped VAE, against the same pipeline with
upstream's VAE.

Covered: `HunyuanVideoPipeline` (text to video, also through `from_pretrained`),
`HunyuanSkyreelsImageToVideoPipeline`, `HunyuanVideoImageToVideoPipeline` (both
image condition types), `HunyuanVideoFramepackPipeline` (both sampling types, one
and two sections), `Kandinsky5T2VPipeline` and `Kandinsky5I2VPipeline`.

Tiny and offline: one-layer random transformers (diffusers' own pipeline-test
widths), the flow-matching scheduler, the hunyuanvideo-tiny VAE, prompt
embeddings passed directly (no text encoders; Framepack's image encoder is a
tiny random SigLIP). Same seeds on both sides; one wrapped VAE for all.
"""

import numpy as np
import pytest
import torch
from PIL import Image

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.hunyuan.conftest import upstream_of
from tests.support.parity import assert_close

pytest.importorskip("transformers", reason="diffusers' HunyuanVideo pipelines need transformers")

from diffusers import (  # noqa: E402
    AutoencoderKLHunyuanVideo,
    FlowMatchEulerDiscreteScheduler,
    HunyuanSkyreelsImageToVideoPipeline,
    HunyuanVideoFramepackPipeline,
    HunyuanVideoFramepackTransformer3DModel,
    HunyuanVideoImageToVideoPipeline,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
    Kandinsky5I2VPipeline,
    Kandinsky5T2VPipeline,
    Kandinsky5Transformer3DModel,
)
from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel  # noqa: E402

# fp32, after the video processor's clamp to [0, 1].
ATOL = 1e-4
TINY = preset_config("hunyuanvideo-tiny")
TEXT_DIM, POOLED_DIM, TEXT_LEN = 16, 8, 6
# 9 frames: 3 latent frames, one decoder call; 21 frames: 6 latent frames, upstream's two windows.
COMMON = dict(height=16, width=16, num_inference_steps=2, guidance_scale=1.0, output_type="pt")


def _seeded(build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


def _transformer(in_channels=4, *, cls=HunyuanVideoTransformer3DModel, patch_size=1, guidance_embeds=True, **extra):
    return _seeded(lambda: cls(
        in_channels=in_channels, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=patch_size, patch_size_t=1,
        guidance_embeds=guidance_embeds, text_embed_dim=TEXT_DIM, pooled_projection_dim=POOLED_DIM,
        rope_axes_dim=(2, 4, 4), **extra,
    ))


def _components(vae, transformer=None, **extra):
    return dict(transformer=_transformer() if transformer is None else transformer, vae=vae,
                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder=None, tokenizer=None,
                text_encoder_2=None, tokenizer_2=None, **extra)


def _image(size):
    """A seeded random RGB image: the image-to-video pipelines encode it with the VAE."""
    return Image.fromarray(np.random.default_rng(2).integers(0, 256, (size, size, 3), dtype=np.uint8))


def _wrapped_matches_upstream(cls, components, vaes, label, shape, **call):
    """``cls(**components(vae))`` with upstream's VAE, then with the wrapped one assigned and built in: same frames."""
    upstream, wrapped = vaes

    def run(pipe):
        return pipe(generator=torch.Generator().manual_seed(0), **call).frames

    expected = run(cls(**components(upstream)))
    assert expected.shape == shape and float(expected.std()) > 0.05
    pipe = cls(**components(upstream))
    pipe.vae = wrapped
    assert isinstance(pipe.vae, ct.TorchaxVAE)
    assert_close(run(pipe), expected, atol=ATOL, label=f"{label}, assigned")
    assert_close(run(cls(**components(wrapped))), expected, atol=ATOL, label=f"{label}, built")


def _embeddings():
    g = torch.Generator().manual_seed(1)
    return dict(prompt_embeds=torch.randn((1, TEXT_LEN, TEXT_DIM), generator=g),
                pooled_prompt_embeds=torch.randn((1, POOLED_DIM), generator=g),
                prompt_attention_mask=torch.ones((1, TEXT_LEN), dtype=torch.long))


@pytest.fixture(scope="module")
def vaes():
    """(upstream's tiny VAE, a copy of it wrapped): the same weights."""
    return upstream_of(TINY, seed=1), ct.wrap(upstream_of(TINY, seed=1), mesh="dp=1,tp=1")


def _run(pipe, frames):
    return pipe(generator=torch.Generator().manual_seed(0), num_frames=frames, **_embeddings(), **COMMON).frames


@pytest.mark.parametrize("frames", [9, 21])
def test_text_to_video_assigned_and_built_around_it(vaes, frames):
    upstream, wrapped = vaes
    expected = _run(HunyuanVideoPipeline(**_components(upstream)), frames)
    assert expected.shape == (1, frames, 3, 16, 16) and float(expected.std()) > 0.05
    pipe = HunyuanVideoPipeline(**_components(upstream))
    pipe.vae = wrapped
    assert isinstance(pipe.vae, ct.TorchaxVAE) and isinstance(pipe.vae, AutoencoderKLHunyuanVideo)
    assert_close(_run(pipe, frames), expected, atol=ATOL, label=f"HunyuanVideoPipeline assigned, {frames} frames")
    built = HunyuanVideoPipeline(**_components(wrapped))
    assert_close(_run(built, frames), expected, atol=ATOL, label=f"HunyuanVideoPipeline built, {frames} frames")


def test_from_pretrained_with_the_wrapped_vae(vaes, tmp_path):
    upstream, wrapped = vaes
    HunyuanVideoPipeline(**_components(upstream)).save_pretrained(tmp_path / "pipe")
    pipe = HunyuanVideoPipeline.from_pretrained(tmp_path / "pipe", vae=wrapped, text_encoder=None, tokenizer=None,
                                                text_encoder_2=None, tokenizer_2=None)
    assert pipe.vae is wrapped
    expected = _run(HunyuanVideoPipeline(**_components(upstream)), 9)
    assert_close(_run(pipe, 9), expected, atol=ATOL, label="HunyuanVideoPipeline.from_pretrained(vae=...)")


def test_skyreels_image_to_video(vaes):
    # The transformer takes the noisy latents and the image's latents side by side: twice the 4 latent channels.
    _wrapped_matches_upstream(
        HunyuanSkyreelsImageToVideoPipeline, lambda vae: _components(vae, _transformer(8)), vaes,
        "HunyuanSkyreelsImageToVideoPipeline", (1, 9, 3, 16, 16),
        image=_image(16), num_frames=9, **_embeddings(), **COMMON,
    )


@pytest.mark.parametrize("condition", ["latent_concat", "token_replace"])
def test_hunyuan_image_to_video(vaes, condition):
    # Prompt embeddings given: neither the LLaVA text encoder nor its image processor is called.
    # latent_concat: noise, image latents and a mask channel (2 * 4 + 1); it drops the first 4 decoded frames.
    in_channels, frames = (9, 5) if condition == "latent_concat" else (4, 9)

    def components(vae):
        transformer = _transformer(in_channels, image_condition_type=condition, guidance_embeds=False)
        return _components(vae, transformer, image_processor=None)

    _wrapped_matches_upstream(
        HunyuanVideoImageToVideoPipeline, components, vaes, f"HunyuanVideoImageToVideoPipeline {condition}",
        (1, frames, 3, 16, 16), image=_image(16), num_frames=9, **_embeddings(), **COMMON,
    )


def _framepack_components(vae):
    transformer = _transformer(cls=HunyuanVideoFramepackTransformer3DModel, patch_size=2, image_condition_type=None,
                               has_image_proj=True, image_proj_dim=32, has_clean_x_embedder=True)
    image_encoder = _seeded(lambda: SiglipVisionModel(SiglipVisionConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4, image_size=30, patch_size=6,
    )))
    return _components(vae, transformer, image_encoder=image_encoder,
                       feature_extractor=SiglipImageProcessor(size={"height": 30, "width": 30}))


# A 3-latent-frame window. 9 frames: one section, one decode; 17 frames: two sections, the second decoded alone
# and soft-appended to the first.
@pytest.mark.parametrize("frames, out_frames", [(9, 13), (17, 25)])
@pytest.mark.parametrize("sampling", ["inverted_anti_drifting", "vanilla"])
def test_framepack_image_to_video(vaes, sampling, frames, out_frames):
    _wrapped_matches_upstream(
        HunyuanVideoFramepackPipeline, _framepack_components, vaes,
        f"HunyuanVideoFramepackPipeline {sampling}, {frames} frames", (1, out_frames, 3, 32, 32),
        image=_image(32), num_frames=frames, latent_window_size=3, sampling_type=sampling, **_embeddings(),
        **dict(COMMON, height=32, width=32),
    )


QWEN_DIM, CLIP_DIM = 16, 32


def _kandinsky_components(vae, visual_cond):
    transformer = _seeded(lambda: Kandinsky5Transformer3DModel(
        in_visual_dim=4, in_text_dim=QWEN_DIM, in_text_dim2=CLIP_DIM, time_dim=32, out_visual_dim=4,
        patch_size=(1, 2, 2), model_dim=48, ff_dim=128, num_text_blocks=1, num_visual_blocks=1, axes_dims=(8, 8, 8),
        visual_cond=visual_cond,
    ))
    return _components(vae, transformer)


def _kandinsky_embeddings():
    g = torch.Generator().manual_seed(1)
    return dict(prompt_embeds_qwen=torch.randn((1, TEXT_LEN, QWEN_DIM), generator=g),
                prompt_embeds_clip=torch.randn((1, CLIP_DIM), generator=g),
                prompt_cu_seqlens=torch.tensor([0, TEXT_LEN], dtype=torch.int32))


# guidance_scale 1: no negative prompt to encode (that needs the Qwen text encoder). Image to video takes 17
# frames: it renormalizes the first 4 latent frames against the ones after them (NaN with none).
@pytest.mark.parametrize("cls, frames", [(Kandinsky5T2VPipeline, 9), (Kandinsky5I2VPipeline, 17)], ids=["t2v", "i2v"])
def test_kandinsky5(vaes, cls, frames):
    image = cls is Kandinsky5I2VPipeline
    _wrapped_matches_upstream(
        cls, lambda vae: _kandinsky_components(vae, visual_cond=image), vaes, cls.__name__, (1, frames, 3, 32, 32),
        **(dict(image=_image(32)) if image else {}), num_frames=frames, **_kandinsky_embeddings(),
        **dict(COMMON, height=32, width=32),
    )
