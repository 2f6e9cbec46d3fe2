"""A tiny offline CogVideoX pipeline: a one-layer random transformer, the tiny VAE, fixed prompt embeddings.

Shared by tests/families/cogvideox/test_pipelines.py and the README's pipeline example
(tests/test_readme.py). Importing it needs transformers: diffusers' pipeline
modules import it, so callers skip first without it.
"""

import torch
from diffusers import CogVideoXDDIMScheduler, CogVideoXTransformer3DModel, ConfigMixin, ModelMixin

import cogvideox_torchax as ct

TEXT_DIM, TEXT_LEN = 32, 16


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


def tiny_wan_transformer(in_channels: int):
    """A two-layer random `WanTransformer3DModel` over 16 latent channels (no image embeddings)."""
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=in_channels,
            out_channels=16,
            text_dim=TEXT_DIM,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        ).eval()


def tiny_wan_pipeline(cls, in_channels: int = 16):
    """A Wan pipeline of ``cls`` around the upstream wan-tiny VAE (seed 0); image to video takes 36 channels."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return cls(
        tokenizer=None,
        text_encoder=None,
        vae=ct.random_upstream("wan-tiny", seed=0),
        transformer=tiny_wan_transformer(in_channels),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


def _seeded(build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


def tiny_wan_vace_transformer():
    """A two-layer random `WanVACETransformer3DModel`: VACE blocks on both layers, 96 VACE channels (its default)."""
    from diffusers import WanVACETransformer3DModel

    return _seeded(lambda: WanVACETransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, vace_layers=[0, 1], vace_in_channels=96,
    ))


def tiny_skyreels_v2_transformer():
    """A two-layer random `SkyReelsV2Transformer3DModel` over 16 latent channels."""
    from diffusers import SkyReelsV2Transformer3DModel

    return _seeded(lambda: SkyReelsV2Transformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ))


def tiny_cosmos_transformer():
    """A two-layer random `CosmosTransformer3DModel` as Cosmos 2's pipelines drive it.

    16 latent channels and the condition mask in; no padding mask (its resize needs torchvision).
    """
    from diffusers import CosmosTransformer3DModel

    return _seeded(lambda: CosmosTransformer3DModel(
        in_channels=17, out_channels=16, num_attention_heads=2, attention_head_dim=16, num_layers=2, mlp_ratio=2,
        text_embed_dim=TEXT_DIM, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2),
        rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False, extra_pos_embed_type="learnable",
    ))


class StandInSafetyChecker(ModelMixin, ConfigMixin):
    """Stands in for Cosmos' guardrail model (the `cosmos_guardrail` package, not installed here): passes everything.

    Cosmos' pipelines build the real one when given None, move it with
    ``to(device)`` and call ``check_text_safety(prompt)`` and
    ``check_video_safety(frames)``; a diffusers model, so that a pipeline
    passed one loads with ``from_pretrained(..., safety_checker=...)``.
    """

    def __init__(self):
        super().__init__()
        self.register_buffer("placed", torch.zeros(()))  # pipelines read a component's device from its tensors

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames):
        return frames


# -- LTX-2 -------------------------------------------------------------------

# The text connectors take the text encoder's hidden states of every layer,
# stacked: LTX2_LAYERS layers of LTX2_CAPTION channels per token.
LTX2_CAPTION, LTX2_LAYERS, LTX2_TEXT_LEN = 32, 2, 8


def tiny_ltx2_components(vae) -> dict:
    """An LTX-2 pipeline's components around ``vae`` (8 latent channels, 8x compression): tiny, random, no text model.

    A one-layer `LTX2VideoTransformer3DModel` (video and audio streams), the
    text connectors, a tiny audio VAE (2 latent channels, 8 mel bins) and
    vocoder, the flow-matching scheduler; tokenizer and text encoder None
    (prompt embeddings are passed: `ltx2_embeddings`).
    """
    from diffusers import AutoencoderKLLTX2Audio, FlowMatchEulerDiscreteScheduler, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    transformer = _seeded(lambda: LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        vae_scale_factors=(8, 8, 8), audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1, caption_channels=LTX2_CAPTION,
        rope_double_precision=False, rope_type="split",
    ))
    connectors = _seeded(lambda: LTX2TextConnectors(
        caption_channels=LTX2_CAPTION, text_proj_in_factor=LTX2_LAYERS, connector_rope_base_seq_len=32,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, rope_double_precision=False, rope_type="split",
    ))
    audio_vae = _seeded(lambda: AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, in_channels=2, resolution=32,
        latent_channels=2, mel_bins=8,
    ))
    # The vocoder reads the audio VAE's output channels times its mel bins.
    vocoder = _seeded(lambda: LTX2Vocoder(
        in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], output_sampling_rate=16000,
    ))
    return {"scheduler": FlowMatchEulerDiscreteScheduler(), "vae": vae, "audio_vae": audio_vae, "text_encoder": None,
            "tokenizer": None, "connectors": connectors, "transformer": transformer, "vocoder": vocoder}


def ltx2_embeddings() -> dict:
    """Prompt embeddings and their attention mask as LTX-2's pipelines take them in place of a prompt."""
    embeds = torch.randn((1, LTX2_TEXT_LEN, LTX2_CAPTION * LTX2_LAYERS), generator=torch.Generator().manual_seed(1))
    return {"prompt_embeds": embeds, "prompt_attention_mask": torch.ones((1, LTX2_TEXT_LEN), dtype=torch.long)}


LTX_CAPTION, LTX_TEXT_LEN = 32, 8


def tiny_ltx_components(vae) -> dict:
    """An LTX-Video pipeline's components around ``vae`` (8 latent channels, 8x compression): tiny, random.

    A one-layer `LTXVideoTransformer3DModel`, the flow-matching scheduler, and
    a stand-in T5 (`StandInTokenizer`, `StandInTextEncoder`): the long
    multi-prompt pipeline takes prompts only, and T5's tokenizer needs files
    this machine cannot fetch. The others take `ltx_embeddings`.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

    transformer = _seeded(lambda: LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, num_layers=1, caption_channels=LTX_CAPTION,
    ))
    return {"scheduler": FlowMatchEulerDiscreteScheduler(), "vae": vae, "text_encoder": StandInTextEncoder(),
            "tokenizer": StandInTokenizer(), "transformer": transformer}


def ltx_embeddings() -> dict:
    """Prompt embeddings and their attention mask as LTX-Video's pipelines take them in place of a prompt."""
    embeds = torch.randn((1, LTX_TEXT_LEN, LTX_CAPTION), generator=torch.Generator().manual_seed(1))
    return {"prompt_embeds": embeds, "prompt_attention_mask": torch.ones((1, LTX_TEXT_LEN), dtype=torch.long)}


class StandInTokenizer:
    """What LTX's pipelines call of a T5 tokenizer: one id per character (mod 100), padded or truncated."""

    model_max_length = LTX_TEXT_LEN

    def __call__(self, prompts, padding="longest", max_length=None, truncation=False, return_tensors="pt",
                 **_):
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        ids = [[1 + ord(c) % 100 for c in p] for p in prompts]
        length = max_length if padding == "max_length" else max(len(i) for i in ids)
        if truncation:
            ids = [i[:length] for i in ids]
        mask = [[1] * len(i) + [0] * (length - len(i)) for i in ids]
        ids = [i + [0] * (length - len(i)) for i in ids]

        class Out:
            input_ids = torch.tensor(ids)
            attention_mask = torch.tensor(mask)

        return Out()

    def batch_decode(self, ids, **_):
        return ["" for _ in ids]


class StandInTextEncoder(ModelMixin, ConfigMixin):
    """What LTX's pipelines call of T5's encoder: ids -> ``(embeddings,)`` of `LTX_CAPTION` channels (seeded)."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            self.embed = torch.nn.Embedding(128, LTX_CAPTION)

    def forward(self, ids, attention_mask=None, **_):
        return (self.embed(ids),)
