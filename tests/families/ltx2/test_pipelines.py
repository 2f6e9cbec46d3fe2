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


def _video(count=9, seed=4):
    return torch.rand((count, 3, 32, 32), generator=torch.Generator().manual_seed(seed))


def test_condition_and_in_context_pipelines_built_around_it():
    # LTX2ConditionPipeline: an image at frame 0 and a video from frame 0, each encoded by the VAE.
    # LTX2InContextPipeline (IC LoRA): a reference video encoded as tokens beside the generated ones.
    from diffusers import LTX2ConditionPipeline, LTX2InContextPipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    wrapped = ct.wrap(upstream_of(TINY, seed=2), mesh="dp=1,tp=1")

    def conditions():
        return [LTX2VideoCondition(frames=_image()[0], index=0, strength=1.0, crf=0),
                LTX2VideoCondition(frames=_video(), index=0, strength=0.5, crf=0)]

    kwargs = dict(conditions=conditions())
    expected = _call(LTX2ConditionPipeline(**tiny_ltx2_components(upstream_of(TINY, seed=2))), **kwargs)
    got = _call(LTX2ConditionPipeline(**tiny_ltx2_components(wrapped)), conditions=conditions())
    _compare(got, expected, "LTX2ConditionPipeline", audio_atol=1e-5)

    def reference():
        return [LTX2ReferenceCondition(frames=_video(seed=5), strength=1.0)]

    expected = _call(LTX2InContextPipeline(**tiny_ltx2_components(upstream_of(TINY, seed=2))),
                     reference_conditions=reference())
    got = _call(LTX2InContextPipeline(**tiny_ltx2_components(wrapped)), reference_conditions=reference())
    _compare(got, expected, "LTX2InContextPipeline", audio_atol=1e-5)


def test_latent_upsample_pipeline_encodes_upsamples_and_decodes():
    from diffusers import LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        upsampler = LTX2LatentUpsamplerModel(in_channels=8, mid_channels=32, num_blocks_per_stage=1).eval()
    video = list(_video())
    kwargs = dict(video=video, height=32, width=32, num_frames=9, output_type="pt",
                  generator=torch.Generator().manual_seed(0))
    expected = LTX2LatentUpsamplePipeline(vae=upstream_of(TINY, seed=3), latent_upsampler=upsampler)(**kwargs).frames
    kwargs["generator"] = torch.Generator().manual_seed(0)
    wrapped = ct.wrap(upstream_of(TINY, seed=3), mesh="dp=1,tp=1")
    got = LTX2LatentUpsamplePipeline(vae=wrapped, latent_upsampler=upsampler)(**kwargs).frames
    assert got.shape == (1, 9, 3, 64, 64) and float(expected.std()) > 0.05
    assert_close(got, expected, atol=ATOL, label="LTX2LatentUpsamplePipeline")


def test_hdr_pipeline_built_around_it():
    # LTX2HDRPipeline (HDR LoRA): a reference video encoded by the VAE, the decoded video mapped from LogC3 to linear
    # light (values far past 1: judged relative to their size).
    from diffusers import LTX2HDRPipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2_hdr_lora import LTX2HDRReferenceCondition

    def hdr(vae):
        return LTX2HDRPipeline(**tiny_ltx2_components(vae))(
            **ltx2_embeddings(), height=32, width=32, num_frames=9, output_type="pt", max_sequence_length=8,
            num_inference_steps=2, generator=torch.Generator().manual_seed(0),
            reference_conditions=[LTX2HDRReferenceCondition(frames=_video(), strength=1.0)]).frames

    expected, got = hdr(upstream_of(TINY, seed=2)), hdr(ct.wrap(upstream_of(TINY, seed=2), mesh="dp=1,tp=1"))
    scale = float(expected.abs().max())
    assert scale > 1 and float(expected.std()) > 0.05  # linear light, not a constant
    # fp32: the LogC3 inverse magnifies the decoder's 1e-6 by its slope (measured 3e-4 at a peak of ~50).
    assert_close(got, expected, atol=2e-5 * scale, label="LTX2HDRPipeline")


def test_dfr_pass_with_keyframe_slots_then_its_temporal_refine():
    # LTX2DFRPipeline's keyframe slots need a transformer with the keyframe marker (LTX-2.5's); its latent output
    # (video, keyframes, their positions, audio) feeds LTX2DFRTemporalRefinePipeline, which doubles the frame rate
    # through a temporal latent upsampler (its ancestral scheduler) and decodes 49 frames.
    from diffusers import (
        LTX2DFRPipeline,
        LTX2DFRTemporalRefinePipeline,
        LTX2VideoTransformer3DModel,
        LTXEulerAncestralRFScheduler,
    )
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        upsampler = LTX2LatentUpsamplerModel(in_channels=8, mid_channels=32, num_blocks_per_stage=1,
                                             spatial_upsample=False, temporal_upsample=True).eval()
        transformer = LTX2VideoTransformer3DModel(
            in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
            vae_scale_factors=(8, 8, 8), audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
            audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1, caption_channels=32,
            rope_double_precision=False, rope_type="split", use_keyframes_abs_pos_embedding=True,
        ).eval()
    kwargs = dict(height=32, width=32, sigmas=[1.0, 0.5], max_sequence_length=8)

    def run(vae):
        components = {**tiny_ltx2_components(vae), "transformer": transformer}
        dfr = LTX2DFRPipeline(**components)
        first = dfr(**ltx2_embeddings(), num_frames=9, generator=torch.Generator().manual_seed(0),
                    output_type="pt", **kwargs).frames
        held = dfr(**ltx2_embeddings(), num_frames=9, generator=torch.Generator().manual_seed(0),
                   output_type="latent", **kwargs)
        refine = LTX2DFRTemporalRefinePipeline(**{**components, "scheduler": LTXEulerAncestralRFScheduler(eta=0.5)},
                                               temporal_latent_upsampler=upsampler)
        second = refine(**ltx2_embeddings(), latents=held.frames, keyframes_latents=held.keyframes,
                        keyframe_positions=held.keyframe_positions, audio_latents=held.audio, num_frames=25,
                        generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs).frames
        return first, second

    expected = run(upstream_of(TINY, seed=2))
    got = run(ct.wrap(upstream_of(TINY, seed=2), mesh="dp=1,tp=1"))
    for label, ours, theirs in zip(("LTX2DFRPipeline", "LTX2DFRTemporalRefinePipeline"), got, expected, strict=True):
        assert float(theirs.std()) > 0.05, label
        assert_close(ours, theirs, atol=ATOL, label=label)  # fp32: 1.1e-6 measured for both
    assert expected[1].shape == (1, 49, 3, 32, 32)


def test_diffusion_decode_pipeline_reads_the_statistics_of_the_wrapped_vae():
    # LTX2VideoDiffusionDecodePipeline decodes with its own diffusion decoder; the VAE gives it the latent
    # statistics and scaling factor (diffusers' own test config of the decoder, LTX-2.4's architecture).
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoDiffusionDecodePipeline,
        LTX2VideoDiffusionDecoderModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        decoder = LTX2VideoDiffusionDecoderModel(
            out_channels=3, latent_channels=8, patch_size=2, decoder_head_dim=16,
            decoder_stage_channels=(64, 32, 16, 16, 16), decoder_stage_depths=(1, 1, 1, 1, 2),
            decoder_stage_kernels=((3, 3, 3),) * 4,
            decoder_upsample_strides=((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2)),
            decoder_upsample_channel_reductions=(2, 2, 1, 1), decoder_stage5_kernel=(3, 3, 3), decoder_t_emb_dim=32,
            spatial_compression_ratio=16, temporal_compression_ratio=8,
        ).eval()
    z = torch.randn(1, 8, 2, 3, 3, generator=torch.Generator().manual_seed(1))

    def run(vae):
        pipe = LTX2VideoDiffusionDecodePipeline(diffusion_decoder=decoder, scheduler=FlowMatchEulerDiscreteScheduler(),
                                                vae=vae)
        return pipe(latents=z, generator=torch.Generator().manual_seed(0), output_type="pt").frames

    expected = run(upstream_of(TINY, seed=2))
    assert float(expected.std()) > 0.05
    assert_close(run(ct.wrap(upstream_of(TINY, seed=2), mesh="dp=1,tp=1")), expected, atol=0,
                 label="LTX2VideoDiffusionDecodePipeline")


@pytest.mark.parametrize("image", [False, True], ids=["text-to-video", "image-to-video"])
def test_sana_video_pipelines_on_the_ltx2_vae(image):
    # SanaVideoPipeline and SanaImageToVideoPipeline take Wan's or LTX-2's VAE, told apart by isinstance, and
    # normalise by LTX-2's statistics buffers.
    from diffusers import (
        DPMSolverMultistepScheduler,
        SanaImageToVideoPipeline,
        SanaVideoPipeline,
        SanaVideoTransformer3DModel,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = SanaVideoTransformer3DModel(
            in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, num_layers=1,
            num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=32,
            sample_size=4, patch_size=(1, 2, 2),
        ).eval()
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 8, dtype=torch.long)
    cls = SanaImageToVideoPipeline if image else SanaVideoPipeline

    def run(vae):
        pipe = cls(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                   scheduler=DPMSolverMultistepScheduler())
        extra = {"image": _image()} if image else {}
        return pipe(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt=None,
                    negative_prompt_embeds=embeds, negative_prompt_attention_mask=mask, guidance_scale=1.0,
                    num_inference_steps=2, height=32, width=32, frames=9, generator=torch.Generator().manual_seed(0),
                    output_type="pt", use_resolution_binning=False, **extra).frames

    expected = run(upstream_of(TINY, seed=2))
    assert float(expected.std()) > 0.05
    assert_close(run(ct.wrap(upstream_of(TINY, seed=2), mesh="dp=1,tp=1")), expected, atol=ATOL,
                 label=f"{cls.__name__} on LTX-2's VAE")
