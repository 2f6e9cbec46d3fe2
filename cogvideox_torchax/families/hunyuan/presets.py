"""HunyuanVideo 1.0's and 1.5's named VAE configs: each release's ``vae/config.json`` and diffusers' test configs.

Each carries ``_class_name`` so that a preset, like a config file, names its
family. Keys left out take the class's defaults, which are its release's
values.
"""

from __future__ import annotations

from typing import Any

_HUNYUAN = {"_class_name": "AutoencoderKLHunyuanVideo"}

PRESETS: dict[str, dict[str, Any]] = {
    # hunyuanvideo-community/HunyuanVideo, vae/ (the VAE every HunyuanVideo
    # pipeline of diffusers loads: text- and image-to-video, FramePack,
    # SkyReels V1): 16 latent channels, 8x space, 4x time.
    "hunyuanvideo": {
        **_HUNYUAN,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 16,
        "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
        "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
        "block_out_channels": [128, 256, 512, 512],
        "layers_per_block": 2,
        "act_fn": "silu",
        "norm_num_groups": 32,
        "scaling_factor": 0.476986,
        "spatial_compression_ratio": 8,
        "temporal_compression_ratio": 4,
        "mid_block_add_attention": True,
    },
    # diffusers' model-test config (tests/models/autoencoders/
    # test_models_autoencoder_hunyuan_video.py): the release's geometry at
    # width 8 and one resnet per block.
    "hunyuanvideo-tiny": {
        **_HUNYUAN,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 4,
        "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
        "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
        "block_out_channels": [8, 8, 8, 8],
        "layers_per_block": 1,
        "act_fn": "silu",
        "norm_num_groups": 4,
        "scaling_factor": 0.476986,
        "spatial_compression_ratio": 8,
        "temporal_compression_ratio": 4,
        "mid_block_add_attention": True,
    },
}

_HUNYUAN15 = {"_class_name": "AutoencoderKLHunyuanVideo15"}

HUNYUAN15_PRESETS: dict[str, dict[str, Any]] = {
    # hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v, vae/ (the same VAE for every 1.5 checkpoint):
    # 32 latent channels, 16x space, 4x time; its samplers fold space and time into channels.
    "hunyuanvideo15": {
        **_HUNYUAN15,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 32,
        "block_out_channels": [128, 256, 512, 1024, 1024],
        "layers_per_block": 2,
        "spatial_compression_ratio": 16,
        "temporal_compression_ratio": 4,
        "downsample_match_channel": True,
        "upsample_match_channel": True,
        "scaling_factor": 1.03682,
    },
    # diffusers' HunyuanVideo 1.5 pipeline-test VAE (tests/pipelines/hunyuan_video1_5/): four blocks of 16, 4x space,
    # 2x time.
    "hunyuanvideo15-tiny": {
        **_HUNYUAN15,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 4,
        "block_out_channels": [16, 16, 16, 16],
        "layers_per_block": 1,
        "spatial_compression_ratio": 4,
        "temporal_compression_ratio": 2,
        "scaling_factor": 0.476986,
    },
}
