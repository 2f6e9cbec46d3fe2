"""diffusers' Wan-VAE pipelines with the wrapped VAE, against the same pipeline with upstream's VAE.

Tiny and offline, as CogVideoX's (tests/families/cogvideox/test_pipelines.py):
tiny random transformers, each pipeline's scheduler, the wan-tiny VAE, prompt
embeddings passed directly. Same seeds on both sides. Wan's text and image
to video take ``pipe.vae = wrap(pipe.vae)``; VACE, video to video,
SkyReels-V2 and Cosmos 2 are built around the wrapped VAE (their
constructors read its ``temperal_downsample``), one wrapped VAE for all, so
the programs of its shapes compile once.
"""

import inspect
import json

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close, psnr

pytest.importorskip("transformers", reason="diffusers' Wan pipelines need transformers")

from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanPipeline  # noqa: E402

from tests.support.pipelines import (  # noqa: E402
    StandInSafetyChecker,
    embeddings,
    tiny_cosmos_transformer,
    tiny_skyreels_v2_transformer,
    tiny_wan_pipeline,
    tiny_wan_transformer,
    tiny_wan_vace_transformer,
)

# fp32, after the video processor's clamp to [0, 1].
ATOL = 1e-4


def _frames(pipe, **kwargs) -> torch.Tensor:
    prompt_embeds, negative_prompt_embeds = embeddings()
    if "num_frames" in inspect.signature(pipe.__call__).parameters:  # video to video takes the video's
        kwargs.setdefault("num_frames", 9)
    return pipe(
        prompt_embeds=prompt_embeds.to(pipe.transformer.dtype),
        negative_prompt_embeds=negative_prompt_embeds.to(pipe.transformer.dtype),
        num_inference_steps=2,
        height=32,
        width=32,
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


# -- the pipelines built around the wrapped VAE ------------------------------


@pytest.fixture(scope="module")
def wrapped():
    return ct.wrap(ct.random_upstream("wan-tiny", seed=0), mesh="dp=1,tp=1")


def _video(frames: int = 9, seed: int = 4) -> list:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(frames)]


def _both(build, wrapped, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's frames around upstream's VAE, then around the wrapped one (passed to its constructor)."""
    expected = _frames(build(ct.random_upstream("wan-tiny", seed=0)), **kwargs)
    pipe = build(wrapped)
    assert pipe.vae is wrapped
    got = _frames(pipe, **kwargs)
    assert got.shape == (1, 9, 3, 32, 32) and float(expected.std()) > 0.01  # a video, not a constant
    return got, expected


def test_vace_with_a_mask_and_a_reference_image_matches_upstream(wrapped):
    # VACE encodes the video's kept and masked parts and the reference image, then decodes.
    from diffusers import FlowMatchEulerDiscreteScheduler, WanVACEPipeline
    from PIL import Image

    def build(vae):
        return WanVACEPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=tiny_wan_vace_transformer(),
                               scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))

    mask = [Image.new("L", (32, 32), 255 if i % 2 else 0) for i in range(9)]
    got, expected = _both(build, wrapped, video=_video(), mask=mask, reference_images=_video(1, seed=5)[0])
    assert_close(got, expected, atol=ATOL, label="WanVACEPipeline frames")
    assert len(wrapped.compiled_shapes("encode")) >= 2  # the video and the reference image went through our encode


def test_video_to_video_matches_upstream(wrapped):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanVideoToVideoPipeline

    def build(vae):
        return WanVideoToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=tiny_wan_transformer(16),
                                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))

    got, expected = _both(build, wrapped, video=_video(), strength=0.8)
    assert_close(got, expected, atol=ATOL, label="WanVideoToVideoPipeline frames")


def test_skyreels_v2_matches_upstream(wrapped):
    from diffusers import SkyReelsV2Pipeline, UniPCMultistepScheduler

    def build(vae):
        scheduler = UniPCMultistepScheduler(flow_shift=8.0, use_flow_sigmas=True, prediction_type="flow_prediction")
        return SkyReelsV2Pipeline(tokenizer=None, text_encoder=None, vae=vae,
                                  transformer=tiny_skyreels_v2_transformer(), scheduler=scheduler)

    got, expected = _both(build, wrapped)
    assert_close(got, expected, atol=ATOL, label="SkyReelsV2Pipeline frames")


def test_cosmos2_video_to_world_matches_upstream(wrapped):
    # The image is encoded as the conditioning video's first frame, the denoised latents decoded.
    from diffusers import Cosmos2VideoToWorldPipeline, FlowMatchEulerDiscreteScheduler

    def build(vae):
        return Cosmos2VideoToWorldPipeline(
            tokenizer=None, text_encoder=None, vae=vae, transformer=tiny_cosmos_transformer(),
            scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True), safety_checker=StandInSafetyChecker())

    image = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(3))
    got, expected = _both(build, wrapped, image=image)
    # Cosmos' pipelines round the frames to uint8 for the safety check: one step of 1/255 is
    # their resolution (measured equal).
    assert_close(got, expected, atol=1 / 255 + 1e-6, label="Cosmos2VideoToWorldPipeline frames")


def test_offload_with_the_vae_passed_at_construction(wrapped):
    # Model offload leaves the wrapped VAE working; sequential offload refuses by name.
    pytest.importorskip("accelerate", reason="diffusers' offload hooks are accelerate's")
    from diffusers import FlowMatchEulerDiscreteScheduler, WanVideoToVideoPipeline

    def build(vae):
        return WanVideoToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=tiny_wan_transformer(16),
                                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))

    expected = _frames(build(ct.random_upstream("wan-tiny", seed=0)), video=_video())
    pipe = build(wrapped)
    pipe.enable_model_cpu_offload(device="cpu")  # the CPU stands in for the accelerator here
    assert_close(_frames(pipe, video=_video()), expected, atol=ATOL, label="model-offloaded video to video")
    pipe.remove_all_hooks()
    with pytest.raises(ct.UnsupportedAttributeError, match="state_dict"):
        build(wrapped).enable_sequential_cpu_offload(device="cpu")
    # An upstream VAE under sequential offload holds its weights in the hooks: wrapping it says how to get them back.
    upstream = build(ct.random_upstream("wan-tiny", seed=0))
    upstream.enable_sequential_cpu_offload(device="cpu")
    with pytest.raises(ValueError, match=r"meta device.*remove_all_hooks"):
        ct.wrap(upstream.vae, mesh="dp=1,tp=1")
    upstream.remove_all_hooks()
    assert ct.wrap(upstream.vae, mesh="dp=1,tp=1").dtype == torch.float32
