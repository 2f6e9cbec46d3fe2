"""diffusers' HunyuanVideo 1.5 pipelines, built on `AutoencoderKLHunyuanVideo15`, with the wrapped VAE against the
same pipeline with upstream's VAE.

Covered: `HunyuanVideo15Pipeline` (text to video, decode only),
`HunyuanVideo15ImageToVideoPipeline` (image to video: the image is encoded by the
VAE too), and the modular `HunyuanVideo15AutoBlocks` from
`diffusers.modular_pipelines.hunyuan_video1_5`, both of its workflows (text to
video; image to video with its VAE encoder step, whose image latents are
compared as well as the frames). Each with the wrapped VAE
assigned (`pipe.vae = wrapped`, or `update_components(vae=wrapped)` for the
modular one) and built in (passed to the constructor; for the modular one, the
first `update_components`).

Tiny and offline: a one-layer random transformer (diffusers' own pipeline-test
widths), the flow-matching scheduler, classifier-free guidance at scale 1, the
hunyuanvideo15-tiny VAE, prompt embeddings passed directly (no text encoders:
the modular pipeline runs without its text-encoder block), image to video's
image encoder a tiny random SigLIP. One video per prompt (upstream's 1.5 VAE
attention, and so the wrapped one, takes one video at a time). Same seeds on
both sides; one wrapped VAE for all.
"""

import numpy as np
import pytest
import torch
from PIL import Image

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.hunyuan.conftest import upstream15_of
from tests.support.parity import assert_close

pytest.importorskip("transformers", reason="diffusers' HunyuanVideo 1.5 pipelines need transformers")

from diffusers import (  # noqa: E402
    AutoencoderKLHunyuanVideo15,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
)
from diffusers.guiders import ClassifierFreeGuidance  # noqa: E402
from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel  # noqa: E402

# fp32, after the video processor's clamp to [0, 1].
ATOL = 1e-4
TINY = preset_config("hunyuanvideo15-tiny")
TEXT_DIM, TEXT_2_DIM, IMAGE_DIM = 16, 32, 12
TEXT_LEN, TEXT_2_LEN = 6, 5
SIZE, FRAMES = 16, 9  # 9 frames: 5 latent frames at the tiny VAE's 2x in time, 4x4 latents.
COMMON = dict(num_frames=FRAMES, num_inference_steps=2, output_type="pt")
SHAPE = (1, FRAMES, 3, SIZE, SIZE)


def _seeded(build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


def _transformer(task_type):
    # in_channels: the noisy latents, the condition latents and a mask channel (2 * 4 + 1).
    return _seeded(lambda: HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=TEXT_DIM,
        text_embed_2_dim=TEXT_2_DIM, image_embed_dim=IMAGE_DIM, rope_axes_dim=(2, 2, 4), target_size=SIZE,
        task_type=task_type,
    ))


def _image_encoder():
    """A tiny random SigLIP whose hidden width is the transformer's image embedding width."""
    return dict(
        image_encoder=_seeded(lambda: SiglipVisionModel(SiglipVisionConfig(
            hidden_size=IMAGE_DIM, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16,
            patch_size=8,
        ))),
        feature_extractor=SiglipImageProcessor(size={"height": 16, "width": 16}),
    )


def _components(vae, task_type="t2v", **extra):
    return dict(transformer=_transformer(task_type), vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                guider=ClassifierFreeGuidance(guidance_scale=1.0), **extra)


def _image():
    """A seeded random RGB image: image to video encodes it with the VAE (and SigLIP)."""
    return Image.fromarray(np.random.default_rng(2).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


def _embeddings():
    """Both prompt streams (the MLLM's, ByT5's glyph text), masks with padding at the end."""
    g = torch.Generator().manual_seed(1)
    mask, mask_2 = torch.ones((1, TEXT_LEN), dtype=torch.long), torch.ones((1, TEXT_2_LEN), dtype=torch.long)
    mask[:, -2:], mask_2[:, -1:] = 0, 0
    return dict(prompt_embeds=torch.randn((1, TEXT_LEN, TEXT_DIM), generator=g), prompt_embeds_mask=mask,
                prompt_embeds_2=torch.randn((1, TEXT_2_LEN, TEXT_2_DIM), generator=g), prompt_embeds_mask_2=mask_2)


@pytest.fixture(scope="module")
def vaes():
    """(upstream's tiny 1.5 VAE, a copy of it wrapped): the same weights."""
    return upstream15_of(TINY, seed=1), ct.wrap(upstream15_of(TINY, seed=1), mesh="dp=1,tp=1")


def _wrapped_matches_upstream(cls, components, vaes, label, **call):
    """``cls(**components(vae))`` with upstream's VAE, then with the wrapped one assigned and built in: same frames."""
    upstream, wrapped = vaes

    def run(pipe):
        return pipe(generator=torch.Generator().manual_seed(0), **_embeddings(), **COMMON, **call).frames

    expected = run(cls(**components(upstream)))
    assert expected.shape == SHAPE and float(expected.std()) > 0.05
    pipe = cls(**components(upstream))
    pipe.vae = wrapped
    assert isinstance(pipe.vae, ct.TorchaxVAE) and isinstance(pipe.vae, AutoencoderKLHunyuanVideo15)
    assert_close(run(pipe), expected, atol=ATOL, label=f"{label}, assigned")
    assert_close(run(cls(**components(wrapped))), expected, atol=ATOL, label=f"{label}, built")


def test_text_to_video(vaes):
    _wrapped_matches_upstream(HunyuanVideo15Pipeline, _components, vaes, "HunyuanVideo15Pipeline",
                              height=SIZE, width=SIZE)


def test_image_to_video(vaes):
    # The size comes from the image (target_size 16: 16x16); the VAE encodes it to the first latent frame's condition.
    _wrapped_matches_upstream(
        HunyuanVideo15ImageToVideoPipeline, lambda vae: _components(vae, "i2v", **_image_encoder()), vaes,
        "HunyuanVideo15ImageToVideoPipeline", image=_image(),
    )


def _modular(vae, image):
    """``HunyuanVideo15AutoBlocks`` less its text-encoder block (embeddings are given), components set offline."""
    from diffusers.modular_pipelines import HunyuanVideo15AutoBlocks

    blocks = HunyuanVideo15AutoBlocks()
    blocks.sub_blocks.pop("text_encoder")
    pipe = blocks.init_pipeline()
    components = _components(vae, "i2v" if image else "t2v", **_image_encoder())
    for name in ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"):
        components.pop(name)
    pipe.update_components(**components)
    return pipe


@pytest.mark.parametrize("workflow", ["text2video", "image2video"])
def test_modular_auto_blocks(vaes, workflow):
    upstream, wrapped = vaes
    image = workflow == "image2video"
    call = dict(image=_image()) if image else dict(height=SIZE, width=SIZE)
    # Image to video also hands back its VAE encoder step's latents of the image: those compared too. (In diffusers
    # 0.42.1 its text-to-video latents step zero-fills `image_embeds` after the SigLIP step; the image latents still
    # condition the first latent frame.)
    outputs = ["videos", "image_latents"] if image else ["videos"]

    def run(pipe):
        return pipe(generator=torch.Generator().manual_seed(0), **_embeddings(), **COMMON, **call, output=outputs)

    expected = run(_modular(upstream, image))
    assert expected["videos"].shape == SHAPE and float(expected["videos"].std()) > 0.05
    pipe = _modular(upstream, image)
    pipe.update_components(vae=wrapped)
    assert pipe.vae is wrapped
    for how, got in (("assigned", run(pipe)), ("built", run(_modular(wrapped, image)))):
        for name in outputs:
            label = f"HunyuanVideo15AutoBlocks {workflow} {name}, {how}"
            assert_close(got[name], expected[name], atol=ATOL, label=label)
