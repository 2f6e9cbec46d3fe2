"""diffusers' LTX-Video pipelines with the wrapped VAE, against the same pipeline with upstream's VAE.

Tiny and offline, as LTX-2's (test_pipelines.py): a one-layer random
`LTXVideoTransformer3DModel`, the flow-matching scheduler, the ltx-tiny VAE
(diffusers' 0.9.1 test config: timestep-conditioned, injecting noise) with
its statistics off (0, 1), prompt embeddings passed directly (a stand-in T5
where a pipeline takes prompts only). Same seeds on both sides: the
pipelines' generator, and torch's global generator, from which upstream's
decoder draws its noise on every decode (``torch.manual_seed`` before each
call). One wrapped VAE for all: the programs of its shapes compile once.
"""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.config import preset_config
from tests.families.ltx2.conftest import upstream_of
from tests.support.parity import assert_close

pytest.importorskip("transformers", reason="diffusers' LTX pipelines need transformers")

from diffusers import (  # noqa: E402
    AutoencoderKLLTXVideo,
    LTXConditionPipeline,
    LTXI2VLongMultiPromptPipeline,
    LTXImageToVideoPipeline,
    LTXLatentUpsamplePipeline,
    LTXPipeline,
)
from diffusers.pipelines.ltx.modeling_latent_upsampler import LTXLatentUpsamplerModel  # noqa: E402

from tests.support.pipelines import ltx_embeddings, tiny_ltx_components  # noqa: E402

# fp32, after the video processor's clamp to [0, 1].
ATOL = 1e-4
TINY = preset_config("ltx-tiny")
COMMON = dict(height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=1.0, output_type="pt",
              decode_timestep=0.05, decode_noise_scale=0.025)


@pytest.fixture(scope="module")
def vaes():
    """(upstream's tiny VAE, a copy of it wrapped): the same weights."""
    upstream = upstream_of(TINY, seed=1)
    return upstream, ct.wrap(upstream_of(TINY, seed=1), mesh="dp=1,tp=1")


def _run(pipe, **kwargs):
    torch.manual_seed(11)  # the VAE's noise
    return pipe(generator=torch.Generator().manual_seed(0), **kwargs).frames


def _image():
    return torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(3))


def _compare(got, expected, label):
    assert float(expected.std()) > 0.05, label  # a video, not a constant
    assert_close(got, expected, atol=ATOL, label=label)


def test_text_and_image_to_video_assigned_and_built_around_it(vaes):
    upstream, wrapped = vaes
    expected = _run(LTXPipeline(**tiny_ltx_components(upstream)), **ltx_embeddings(), **COMMON)
    pipe = LTXPipeline(**tiny_ltx_components(upstream))
    pipe.vae = wrapped
    assert isinstance(pipe.vae, ct.TorchaxVAE) and isinstance(pipe.vae, AutoencoderKLLTXVideo)
    got = _run(pipe, **ltx_embeddings(), **COMMON)
    assert got.shape == (1, 9, 3, 32, 32)
    _compare(got, expected, "LTXPipeline, vae assigned")
    # The decode timestep and the injected noise reach the decoder: another global seed, another video.
    torch.manual_seed(12)
    other = pipe(generator=torch.Generator().manual_seed(0), **ltx_embeddings(), **COMMON).frames
    assert (other - got).abs().max() > 1e-3
    expected = _run(LTXImageToVideoPipeline(**tiny_ltx_components(upstream)), image=_image(), **ltx_embeddings(),
                    **COMMON)
    built = LTXImageToVideoPipeline(**pipe.components)
    assert built.vae is wrapped
    _compare(_run(built, image=_image(), **ltx_embeddings(), **COMMON), expected,
             "LTXImageToVideoPipeline, vae at construction")


def test_condition_pipeline_with_an_image_and_a_video_condition(vaes):
    from diffusers.pipelines.ltx.pipeline_ltx_condition import LTXVideoCondition
    from PIL import Image

    upstream, wrapped = vaes
    frames = (torch.rand((9, 32, 32, 3), generator=torch.Generator().manual_seed(4)) * 255).to(torch.uint8).numpy()
    video = [Image.fromarray(f) for f in frames]

    def conditions():
        return [LTXVideoCondition(image=Image.fromarray(frames[0]), frame_index=0),
                LTXVideoCondition(video=video, frame_index=0, strength=0.5)]

    expected = _run(LTXConditionPipeline(**tiny_ltx_components(upstream)), conditions=conditions(),
                    **ltx_embeddings(), **COMMON)
    got = _run(LTXConditionPipeline(**tiny_ltx_components(wrapped)), conditions=conditions(), **ltx_embeddings(),
               **COMMON)
    _compare(got, expected, "LTXConditionPipeline, vae at construction")


def test_latent_upsample_pipeline_encodes_upsamples_and_decodes(vaes):
    upstream, wrapped = vaes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        upsampler = LTXLatentUpsamplerModel(in_channels=8, mid_channels=32, num_blocks_per_stage=1).eval()
    video = [torch.rand((3, 32, 32), generator=torch.Generator().manual_seed(i)) for i in range(9)]
    kwargs = dict(video=video, height=32, width=32, decode_timestep=0.05, decode_noise_scale=0.025,
                  output_type="pt")
    expected = _run(LTXLatentUpsamplePipeline(vae=upstream, latent_upsampler=upsampler), **kwargs)
    got = _run(LTXLatentUpsamplePipeline(vae=wrapped, latent_upsampler=upsampler), **kwargs)
    assert got.shape == (1, 9, 3, 64, 64)  # twice the size: the upsampled latents decoded
    _compare(got, expected, "LTXLatentUpsamplePipeline")


def test_long_multi_prompt_pipeline_decodes_its_own_tiles(vaes):
    # Sliding temporal windows, one prompt each, and a tiled decode of its own (a vae.decode per tile).
    upstream, wrapped = vaes
    kwargs = dict(prompt="a cat | a dog", height=32, width=64, num_frames=17, num_inference_steps=2,
                  temporal_tile_size=16, temporal_overlap=8, decode_horizontal_tiles=2, decode_vertical_tiles=1,
                  decode_overlap=1, cond_image=_image(), max_sequence_length=8, output_type="pt")
    expected = _run(LTXI2VLongMultiPromptPipeline(**tiny_ltx_components(upstream)), **kwargs)
    got = _run(LTXI2VLongMultiPromptPipeline(**tiny_ltx_components(wrapped)), **kwargs)
    assert got.shape[1:] == expected.shape[1:] and got.shape[-2:] == (32, 64)
    _compare(got, expected, "LTXI2VLongMultiPromptPipeline")


@pytest.mark.parametrize("image", [False, True], ids=["text-to-video", "image-to-video"])
def test_the_modular_ltx_blocks(vaes, image):
    # LTXAutoBlocks: text encoder, (vae encoder), denoise and decode steps; components by update_components.
    from diffusers.modular_pipelines import LTXAutoBlocks

    blocks = LTXAutoBlocks()
    wanted = {spec.name for spec in blocks.expected_components}

    def run(vae):
        pipe = blocks.init_pipeline()
        pipe.update_components(**{k: v for k, v in tiny_ltx_components(vae).items() if k in wanted})
        torch.manual_seed(11)
        extra = {"image": _image()} if image else {}
        return pipe(prompt="a cat", height=32, width=32, num_frames=9, num_inference_steps=2,
                    generator=torch.Generator().manual_seed(0), decode_timestep=0.05, decode_noise_scale=0.025,
                    output_type="pt", output="videos", **extra)

    upstream, wrapped = vaes
    _compare(run(wrapped), run(upstream), f"LTXAutoBlocks {'image' if image else 'text'} to video")
