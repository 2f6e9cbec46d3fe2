"""diffusers' CogVideoX pipelines with ``pipe.vae = wrap(pipe.vae)``, against the same pipeline as upstream.

The pipelines are tiny and offline: a tiny random transformer, the DDIM
scheduler, the tiny VAE config, and prompt embeddings passed directly (no
tokenizer or text encoder). Same seeds on both sides, so the only difference
is which VAE encodes (image to video) and decodes.
"""

import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close, psnr

# diffusers' pipeline modules import transformers (for the T5 text encoder
# we never build); without it the pipelines are placeholders that raise.
pytest.importorskip("transformers", reason="diffusers' CogVideoX pipelines need transformers")

from diffusers import CogVideoXImageToVideoPipeline, CogVideoXPipeline  # noqa: E402

from tests.support.pipelines import embeddings, tiny_pipeline  # noqa: E402

# fp32, after the video processor's clamp to [0, 1]: measured 2.1e-6 (text
# to video) and 7.9e-6 (image to video; two denoising steps amplify the
# encode's 1e-7 differences).
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


# The pipeline's own moves and saving, with the VAE wrapped.


def test_pipeline_dtype_moves_reach_the_wrapped_vae():
    pipe = _ours(tiny_pipeline(CogVideoXPipeline, 4))
    assert isinstance(pipe.vae, torch.nn.Module) and "vae" in pipe.components and pipe.dtype == torch.float32
    fp32 = _frames(pipe)
    pipe.to(torch.bfloat16)
    assert pipe.vae.dtype == torch.bfloat16 and pipe.transformer.dtype == torch.bfloat16
    assert pipe.vae.plan.placement.dtype == "bfloat16"  # programs re-planned for the new dtype
    pipe.to("cpu", torch.float32)
    assert pipe.vae.dtype == torch.float32 and pipe.vae.device == torch.device("cpu")
    pipe.to(dtype=torch.bfloat16)
    assert pipe.vae.dtype == torch.bfloat16
    bf16 = _frames(pipe)
    assert bf16.dtype == torch.bfloat16  # the video processor keeps the VAE's dtype
    # The whole pipeline in bf16 (transformer and VAE): the frames stay the
    # fp32 pipeline's to within its rounding (measured PSNR 39.4 dB; a VAE
    # left in fp32 would fail the dtype checks above, not this one).
    assert psnr(bf16.float(), fp32) > 30
    # A dtype the VAE cannot run is an error naming those it can, never a silent fp32 VAE.
    with pytest.raises(ValueError, match=r"cannot run in torch.float64: dtype must be float32"):
        pipe.to(torch.float64)
    assert pipe.vae.dtype == torch.bfloat16


def test_saved_pipeline_names_upstreams_vae_and_decodes_as_before_once_wrapped_again(tmp_path):
    import json

    from diffusers import AutoencoderKLCogVideoX

    pipe = _ours(tiny_pipeline(CogVideoXPipeline, 4))
    before = _frames(pipe)
    pipe.save_pretrained(tmp_path)
    # Upstream's format and upstream's name: nothing in the folder needs this package.
    model_index = json.loads((tmp_path / "model_index.json").read_text())
    assert model_index["vae"] == ["diffusers", "AutoencoderKLCogVideoX"]
    assert json.loads((tmp_path / "vae" / "config.json").read_text())["_class_name"] == "AutoencoderKLCogVideoX"
    assert "cogvideox_torchax" not in "".join(p.read_text() for p in tmp_path.rglob("*.json"))
    loaded = CogVideoXPipeline.from_pretrained(tmp_path, tokenizer=None, text_encoder=None)
    assert type(loaded.vae) is AutoencoderKLCogVideoX
    assert_close(_frames(loaded), before, atol=ATOL, label="upstream VAE from the saved pipeline")
    loaded.vae = ct.wrap(loaded.vae, mesh="dp=1,tp=1")
    assert_close(_frames(loaded), before, atol=0.0, label="saved pipeline, wrapped again")
    # Saved again once wrapped: the same names (the pipeline's config follows `pipe.vae = ...`).
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "model_index.json").read_text())["vae"] == model_index["vae"]
    # The pipeline's dtype reaches the VAE it loads, and our loader reads the folder too.
    assert CogVideoXPipeline.from_pretrained(
        tmp_path, tokenizer=None, text_encoder=None, dtype=torch.bfloat16
    ).vae.dtype == torch.bfloat16
    ours = ct.from_pretrained(str(tmp_path), subfolder="vae", mesh="dp=1,tp=1")
    assert ours.dtype == torch.float32 and type(ours) is ct.TorchaxVAE


def test_pipeline_saved_naming_our_class_still_loads(tmp_path):
    # What earlier versions wrote into model_index.json: such folders load, wrapped.
    import json

    pipe = _ours(tiny_pipeline(CogVideoXPipeline, 4))
    before = _frames(pipe)
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    index["vae"] = ["cogvideox_torchax.runtime.vae", "TorchaxVAE"]
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    loaded = CogVideoXPipeline.from_pretrained(tmp_path, tokenizer=None, text_encoder=None)
    assert type(loaded.vae) is ct.TorchaxVAE
    assert_close(_frames(loaded), before, atol=0.0, label="pipeline saved naming TorchaxVAE")


def test_wrapped_vae_stands_in_for_upstreams_class():
    from diffusers import AutoencoderKLCogVideoX

    vae = _ours(tiny_pipeline(CogVideoXPipeline, 4)).vae
    assert type(vae) is ct.TorchaxVAE and isinstance(vae, AutoencoderKLCogVideoX)
    assert ct.wrap(vae) is vae and type(vae).__module__ == "cogvideox_torchax.vae.torchax_vae"
    assert {"decode_jax", "memory_plan", "plan", "mesh"} <= set(dir(vae))  # our API, not upstream's
    from cogvideox_torchax.families.cogvideox.patches.frame_scan import apply_frame_scan

    with pytest.raises(TypeError):  # the patches take upstream's module, not the stand-in
        apply_frame_scan(vae)


def test_pipeline_save_refuses_pickles_for_the_vae(tmp_path):
    pipe = _ours(tiny_pipeline(CogVideoXPipeline, 4))
    with pytest.raises(ValueError, match="safetensors only"):
        pipe.save_pretrained(tmp_path, safe_serialization=False)
    assert not (tmp_path / "vae").exists()


def test_the_model_cards_float16_setup_works_after_wrapping():
    # CogVideoX-2b's card: torch_dtype=torch.float16, then vae.enable_tiling()
    # and vae.enable_slicing() on the pipeline's VAE, here after wrapping.
    fp32 = _frames(tiny_pipeline(CogVideoXPipeline, 4))
    pipe = tiny_pipeline(CogVideoXPipeline, 4).to(torch.float16)
    pipe.vae = ct.wrap(pipe.vae, mesh="dp=1,tp=1")
    assert pipe.vae.dtype == torch.float16 and pipe.vae.plan.placement.dtype == "float16"
    pipe.vae.enable_tiling()
    pipe.vae.enable_slicing()
    fp16 = _frames(pipe)
    assert fp16.dtype == torch.float16 and bool(torch.isfinite(fp16).all())
    # Transformer and VAE in fp16: measured PSNR 58.8 dB against the fp32
    # pipeline (upstream's fp16 pipeline: 58.9).
    assert psnr(fp16.float(), fp32) > 40


def test_model_offload_hooks_leave_the_wrapped_vae_working():
    pytest.importorskip("accelerate", reason="diffusers' offload hooks are accelerate's")
    expected = _frames(tiny_pipeline(CogVideoXPipeline, 4))
    pipe = _ours(tiny_pipeline(CogVideoXPipeline, 4))
    pipe.enable_model_cpu_offload(device="cpu")  # the CPU stands in for the accelerator here
    assert_close(_frames(pipe), expected, atol=ATOL, label="model-offloaded pipeline frames")
    # Sequential offload moves each torch parameter: the VAE has none, and
    # says so by name instead of being silently skipped.
    pipe = _ours(tiny_pipeline(CogVideoXPipeline, 4))
    with pytest.raises(ct.UnsupportedAttributeError, match="state_dict"):
        pipe.enable_sequential_cpu_offload(device="cpu")
