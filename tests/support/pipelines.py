"""A tiny offline CogVideoX pipeline: a one-layer random transformer, the tiny VAE, fixed prompt embeddings.

Shared by tests/test_pipelines.py and the README's pipeline example
(tests/test_readme.py). Importing it needs transformers: diffusers' pipeline
modules import it, so callers skip first without it.
"""

import torch
from diffusers import CogVideoXDDIMScheduler, CogVideoXTransformer3DModel

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
