"""diffusers' CogVideoX pipelines with ``pipe.vae = wrap(pipe.vae)``, against the same pipeline as upstream.

The pipelines are tiny and offline: a tiny random transformer, the DDIM
scheduler, the tiny VAE config, and prompt embeddings passed directly (no
tokenizer or text encoder). Same seeds on both sides, so the only difference
is which VAE encodes (image to video) and decodes.
"""

import pytest
import torch

import cogvideox_torchax as ct
from tests.parity import assert_close

# diffusers' pipeline modules import transformers (for the T5 text encoder
# we never build); without it the pipelines are placeholders that raise.
pytest.importorskip("transformers", reason="diffusers' CogVideoX pipelines need transformers")

from diffusers import (  # noqa: E402
    CogVideoXDDIMScheduler,
    CogVideoXImageToVideoPipeline,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
)

TEXT_DIM, TEXT_LEN = 32, 16
# fp32, after the video processor's clamp to [0, 1]: measured 2.1e-6 (text
# to video) and 7.9e-6 (image to video; two denoising steps amplify the
# encode's 1e-7 differences).
ATOL = 1e-4


def tiny_transformer(in_channels: int) -> CogVideoXTransformer3DModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return CogVideoXTransformer3DModel(
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=in_channels,
            out_channels=4,
            time_embed_dim=2,
            text_embed_dim=TEXT_DIM,
            num_layers=1,
            sample_width=4,
            sample_height=4,
            sample_frames=9,
            patch_size=2,
            temporal_compression_ratio=4,
            max_text_seq_length=TEXT_LEN,
        ).eval()


def tiny_pipeline(cls, in_channels: int):
    """A pipeline of ``cls`` around the upstream tiny VAE (seed 0)."""
    return cls(
        tokenizer=None,
        text_encoder=None,
        vae=ct.random_upstream("tiny", seed=0),
        transformer=tiny_transformer(in_channels),
        scheduler=CogVideoXDDIMScheduler(),
    )


def embeddings() -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.randn((1, TEXT_LEN, TEXT_DIM), generator=torch.Generator().manual_seed(1)),
        torch.randn((1, TEXT_LEN, TEXT_DIM), generator=torch.Generator().manual_seed(2)),
    )


def _frames(pipe, **kwargs) -> torch.Tensor:
    prompt_embeds, negative_prompt_embeds = embeddings()
    return pipe(
        prompt_embeds=prompt_embeds,
        negative_prompt_embeds=negative_prompt_embeds,
        num_inference_steps=2,
        height=32,
        width=32,
        num_frames=9,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **kwargs,
    ).frames


def _ours(pipe):
    pipe.vae = ct.wrap(pipe.vae, mesh="dp=1,tp=1")
    pipe.to("cpu")  # the pipeline moves its torch modules and leaves ours be
    assert isinstance(pipe.vae, ct.TorchaxVAE)
    return pipe


def test_text_to_video_decodes_as_upstream():
    expected = _frames(tiny_pipeline(CogVideoXPipeline, 4))
    got = _frames(_ours(tiny_pipeline(CogVideoXPipeline, 4)))
    assert got.shape == (1, 9, 3, 32, 32)
    assert_close(got, expected, atol=ATOL, label="CogVideoXPipeline frames")


def test_image_to_video_encodes_and_decodes_as_upstream():
    # The image is encoded (posterior sampled with the pipeline's generator)
    # and the denoised latents decoded, both by our VAE.
    image = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(3))
    expected = _frames(tiny_pipeline(CogVideoXImageToVideoPipeline, 8), image=image)
    pipe = _ours(tiny_pipeline(CogVideoXImageToVideoPipeline, 8))
    got = _frames(pipe, image=image)
    assert got.shape == (1, 9, 3, 32, 32)
    assert_close(got, expected, atol=ATOL, label="CogVideoXImageToVideoPipeline frames")
    assert pipe.vae.compiled_shapes("encode")  # the image went through our encode
