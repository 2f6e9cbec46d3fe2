"""diffusers' Wan pipelines with ``pipe.vae = wrap(pipe.vae)``, against the same pipeline with upstream's VAE.

Tiny and offline, as CogVideoX's (tests/test_pipelines.py): a tiny random
transformer, the flow-matching scheduler, the wan-tiny VAE, prompt
embeddings passed directly. Same seeds on both sides.
"""

import json

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close, psnr

pytest.importorskip("transformers", reason="diffusers' Wan pipelines need transformers")

from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanPipeline  # noqa: E402

from tests.support.pipelines import embeddings, tiny_wan_pipeline  # noqa: E402

# fp32, after the video processor's clamp to [0, 1].
ATOL = 1e-4


def _frames(pipe, **kwargs) -> torch.Tensor:
    prompt_embeds, negative_prompt_embeds = embeddings()
    return pipe(
        prompt_embeds=prompt_embeds.to(pipe.transformer.dtype),
        negative_prompt_embeds=negative_prompt_embeds.to(pipe.transformer.dtype),
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
    pipe.to("cpu")
    assert isinstance(pipe.vae, ct.TorchaxVAE) and isinstance(pipe.vae, AutoencoderKLWan)
    return pipe


def test_text_to_video_decodes_as_upstream():
    expected = _frames(tiny_wan_pipeline(WanPipeline))
    got = _frames(_ours(tiny_wan_pipeline(WanPipeline)))
    assert got.shape == (1, 9, 3, 32, 32)
    assert_close(got, expected, atol=ATOL, label="WanPipeline frames")


def test_image_to_video_encodes_and_decodes_as_upstream():
    # The first frame is encoded (the posterior's mode, as the pipeline asks)
    # and the denoised latents decoded, both by our VAE.
    image = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(3))
    expected = _frames(tiny_wan_pipeline(WanImageToVideoPipeline, 36), image=image)
    pipe = _ours(tiny_wan_pipeline(WanImageToVideoPipeline, 36))
    got = _frames(pipe, image=image)
    assert_close(got, expected, atol=ATOL, label="WanImageToVideoPipeline frames")
    assert pipe.vae.compiled_shapes("encode")  # the condition video went through our encode


def test_save_reload_dtype_moves_and_offload(tmp_path):
    pipe = _ours(tiny_wan_pipeline(WanPipeline))
    fp32 = _frames(pipe)
    # Saved: upstream's names and format; loads with upstream's VAE, then wraps again.
    pipe.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "model_index.json").read_text())["vae"] == ["diffusers", "AutoencoderKLWan"]
    assert json.loads((tmp_path / "vae" / "config.json").read_text())["_class_name"] == "AutoencoderKLWan"
    loaded = WanPipeline.from_pretrained(tmp_path, tokenizer=None, text_encoder=None)
    assert type(loaded.vae) is AutoencoderKLWan
    upstream_vae = _frames(loaded)
    # diffusers' reloaded transformer itself moves the latents by ~2e-6.
    assert_close(upstream_vae, fp32, atol=ATOL, label="saved Wan pipeline, upstream's VAE")
    loaded.vae = ct.wrap(loaded.vae, mesh="dp=1,tp=1")
    assert_close(_frames(loaded), upstream_vae, atol=ATOL, label="saved Wan pipeline, wrapped again")
    assert ct.from_pretrained(str(tmp_path), subfolder="vae", mesh="dp=1,tp=1").family.name == "wan"
    # The pipeline's dtype reaches the wrapped VAE.
    pipe.to(torch.bfloat16)
    assert pipe.vae.dtype == torch.bfloat16 and pipe.vae.plan.placement.dtype == "bfloat16"
    bf16 = _frames(pipe)
    assert bf16.dtype == torch.bfloat16 and psnr(bf16.float(), fp32) > 30
    # Model CPU offload: accelerate's hooks leave the wrapped VAE working.
    pytest.importorskip("accelerate", reason="diffusers' offload hooks are accelerate's")
    offloaded = _ours(tiny_wan_pipeline(WanPipeline))
    offloaded.enable_model_cpu_offload(device="cpu")
    assert_close(_frames(offloaded), fp32, atol=ATOL, label="model-offloaded Wan pipeline frames")
