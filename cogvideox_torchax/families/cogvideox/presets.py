"""CogVideoX's named VAE configs: the published checkpoints' ``vae/config.json`` and diffusers' test config."""

from __future__ import annotations

from typing import Any

_FOUR_BLOCKS = {
    "down_block_types": ["CogVideoXDownBlock3D"] * 4,
    "up_block_types": ["CogVideoXUpBlock3D"] * 4,
}

# The VAE configs published with the CogVideoX checkpoints (vae/config.json);
# 2b and 5b differ only in the latent scaling factor.
PRESETS: dict[str, dict[str, Any]] = {
    "cogvideox-2b": {
        **_FOUR_BLOCKS,
        "block_out_channels": [128, 256, 256, 512],
        "latent_channels": 16,
        "layers_per_block": 3,
        "norm_num_groups": 32,
        "norm_eps": 1e-6,
        "temporal_compression_ratio": 4,
        "sample_height": 480,
        "sample_width": 720,
        "scaling_factor": 1.15258426,
    },
    "cogvideox-5b": {
        **_FOUR_BLOCKS,
        "block_out_channels": [128, 256, 256, 512],
        "latent_channels": 16,
        "layers_per_block": 3,
        "norm_num_groups": 32,
        "norm_eps": 1e-6,
        "temporal_compression_ratio": 4,
        "sample_height": 480,
        "sample_width": 720,
        "scaling_factor": 0.7,
    },
    # CogVideoX 1.5's VAE (vae/config.json of the 1.5 checkpoints): the same
    # architecture at 768x1360, scaling factor 0.7, and invert_scale_latents,
    # which its image-to-video pipeline reads when it scales the image's
    # latents (decoding divides by the scaling factor as for 1.0).
    "cogvideox-1.5": {
        **_FOUR_BLOCKS,
        "block_out_channels": [128, 256, 256, 512],
        "latent_channels": 16,
        "layers_per_block": 3,
        "norm_num_groups": 32,
        "norm_eps": 1e-6,
        "temporal_compression_ratio": 4,
        "sample_height": 768,
        "sample_width": 1360,
        "scaling_factor": 0.7,
        "invert_scale_latents": True,
    },
    # diffusers' own CogVideoX VAE test config: every code path, tiny widths.
    "tiny": {
        **_FOUR_BLOCKS,
        "block_out_channels": [8, 8, 8, 8],
        "latent_channels": 4,
        "layers_per_block": 1,
        "norm_num_groups": 2,
        "temporal_compression_ratio": 4,
    },
}
