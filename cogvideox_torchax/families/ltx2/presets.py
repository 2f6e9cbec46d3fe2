"""LTX-2's and LTX-Video 0.9's named VAE configs: the releases' ``vae/config.json`` and diffusers' test configs.

Each carries ``_class_name`` so that a preset, like a config file, names its
family. The values are the ones diffusers' conversion script
(``scripts/convert_ltx2_to_diffusers.py``, ``get_ltx2_video_vae_config``)
writes for each release; keys left out take `AutoencoderKLLTX2Video`'s
defaults.
"""

from __future__ import annotations

from typing import Any

_LTX2 = {"_class_name": "AutoencoderKLLTX2Video"}

_ENCODER = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 128,
    "down_block_types": ["LTX2VideoDownBlock3D"] * 4,
    "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
    "spatio_temporal_scaling": [True, True, True, True],
    "patch_size": 4,
    "patch_size_t": 1,
    "resnet_norm_eps": 1e-6,
    "scaling_factor": 1.0,
    "encoder_causal": True,
    "encoder_spatial_padding_mode": "zeros",
    "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8,
}

PRESETS: dict[str, dict[str, Any]] = {
    # LTX-2 (Lightricks/LTX-2, vae/): 128 latent channels, 32x spatial and 8x
    # temporal compression; the decoder is not causal, pads with reflection,
    # and has no timestep conditioning.
    "ltx2": {
        **_LTX2,
        **_ENCODER,
        "block_out_channels": [256, 512, 1024, 2048],
        "layers_per_block": [4, 6, 6, 2, 2],
        "decoder_block_out_channels": [256, 512, 1024],
        "decoder_layers_per_block": [5, 5, 5, 5],
        "decoder_spatio_temporal_scaling": [True, True, True],
        "decoder_inject_noise": [False, False, False, False],
        "upsample_type": ["spatiotemporal", "spatiotemporal", "spatiotemporal"],
        "upsample_residual": [True, True, True],
        "upsample_factor": [2, 2, 2],
        "timestep_conditioning": False,
        "decoder_causal": False,
        "decoder_spatial_padding_mode": "reflect",
    },
    # LTX-2.3 (Lightricks/LTX-2.3, vae/): four decoder stages, time and space
    # upsampled in separate blocks, no upsampler residuals, zero padding.
    "ltx2.3": {
        **_LTX2,
        **_ENCODER,
        "block_out_channels": [256, 512, 1024, 1024],
        "layers_per_block": [4, 6, 4, 2, 2],
        "decoder_block_out_channels": [256, 512, 512, 1024],
        "decoder_layers_per_block": [4, 6, 4, 2, 2],
        "decoder_spatio_temporal_scaling": [True, True, True, True],
        "decoder_inject_noise": [False, False, False, False, False],
        "upsample_type": ["spatiotemporal", "spatiotemporal", "temporal", "spatial"],
        "upsample_residual": [False, False, False, False],
        "upsample_factor": [2, 2, 1, 2],
        "timestep_conditioning": False,
        "decoder_causal": False,
        "decoder_spatial_padding_mode": "zeros",
    },
    # diffusers' own AutoencoderKLLTX2Video test config
    # (tests/models/autoencoders/test_models_autoencoder_ltx2_video.py), but
    # with the released decoder's reflection padding (the test config pads
    # with zeros only because reflection has no deterministic backward) and
    # its compression ratios stated: left out, upstream takes 2^4 = 16 for
    # both (one doubling per True in spatio_temporal_scaling), where this
    # architecture compresses 8x in space and in time.
    "ltx2-tiny": {
        **_LTX2,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 8,
        "block_out_channels": [8, 8, 8, 8],
        "decoder_block_out_channels": [16, 32, 64],
        "layers_per_block": [1, 1, 1, 1, 1],
        "decoder_layers_per_block": [1, 1, 1, 1],
        "spatio_temporal_scaling": [True, True, True, True],
        "decoder_spatio_temporal_scaling": [True, True, True],
        "decoder_inject_noise": [False, False, False, False],
        "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
        "upsample_residual": [True, True, True],
        "upsample_factor": [2, 2, 2],
        "timestep_conditioning": False,
        "patch_size": 1,
        "patch_size_t": 1,
        "encoder_causal": True,
        "decoder_causal": False,
        "encoder_spatial_padding_mode": "zeros",
        "decoder_spatial_padding_mode": "reflect",
        "spatial_compression_ratio": 8,
        "temporal_compression_ratio": 8,
    },
}


_LTX_VIDEO = {"_class_name": "AutoencoderKLLTXVideo"}

_LTX_VIDEO_COMMON = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 128,
    "patch_size": 4,
    "patch_size_t": 1,
    "resnet_norm_eps": 1e-6,
    "scaling_factor": 1.0,
    "encoder_causal": True,
    "decoder_causal": False,
}

# LTX-Video 0.9's VAE configs, as diffusers' conversion script
# (``scripts/convert_ltx_to_diffusers.py``, ``get_vae_config``) writes them
# for each release; keys left out take `AutoencoderKLLTXVideo`'s defaults.
LTX_VIDEO_PRESETS: dict[str, dict[str, Any]] = {
    # 0.9.0 (Lightricks/LTX-Video, vae/): 32x space, 8x time, one decoder
    # block per encoder block, no timestep conditioning, no noise.
    "ltx-0.9.0": {
        **_LTX_VIDEO,
        **_LTX_VIDEO_COMMON,
        "block_out_channels": [128, 256, 512, 512],
        "decoder_block_out_channels": [128, 256, 512, 512],
        "layers_per_block": [4, 3, 3, 3, 4],
        "decoder_layers_per_block": [4, 3, 3, 3, 4],
        "spatio_temporal_scaling": [True, True, True, False],
        "decoder_spatio_temporal_scaling": [True, True, True, False],
        "decoder_inject_noise": [False, False, False, False, False],
        "upsample_residual": [False, False, False, False],
        "upsample_factor": [1, 1, 1, 1],
        "timestep_conditioning": False,
    },
    # 0.9.1: a wider decoder, conditioned on the decode timestep, injecting
    # noise in its three up blocks (torch.randn on every decode).
    "ltx-0.9.1": {
        **_LTX_VIDEO,
        **_LTX_VIDEO_COMMON,
        "block_out_channels": [128, 256, 512, 512],
        "decoder_block_out_channels": [256, 512, 1024],
        "layers_per_block": [4, 3, 3, 3, 4],
        "decoder_layers_per_block": [5, 6, 7, 8],
        "spatio_temporal_scaling": [True, True, True, False],
        "decoder_spatio_temporal_scaling": [True, True, True],
        "decoder_inject_noise": [True, True, True, False],
        "downsample_type": ["conv", "conv", "conv", "conv"],
        "upsample_residual": [True, True, True],
        "upsample_factor": [2, 2, 2],
        "timestep_conditioning": True,
    },
    # 0.9.5 (the script writes 0.9.7's the same): the second down block
    # kind, time and space compressed in separate blocks, no noise; ratios
    # stated (left out, its four scaling blocks would make upstream say 64x).
    "ltx-0.9.5": {
        **_LTX_VIDEO,
        **_LTX_VIDEO_COMMON,
        "block_out_channels": [128, 256, 512, 1024, 2048],
        "down_block_types": ["LTXVideo095DownBlock3D"] * 4,
        "decoder_block_out_channels": [256, 512, 1024],
        "layers_per_block": [4, 6, 6, 2, 2],
        "decoder_layers_per_block": [5, 5, 5, 5],
        "spatio_temporal_scaling": [True, True, True, True],
        "decoder_spatio_temporal_scaling": [True, True, True],
        "decoder_inject_noise": [False, False, False, False],
        "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
        "upsample_residual": [True, True, True],
        "upsample_factor": [2, 2, 2],
        "timestep_conditioning": True,
        "spatial_compression_ratio": 32,
        "temporal_compression_ratio": 8,
    },
    # diffusers' own 0.9.1 model-test config
    # (tests/models/autoencoders/test_models_autoencoder_ltx_video.py):
    # 8 latent channels, 8x space and time, timestep conditioning and noise
    # injection, as the 0.9.1 release.
    "ltx-tiny": {
        **_LTX_VIDEO,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 8,
        "block_out_channels": [8, 8, 8, 8],
        "decoder_block_out_channels": [16, 32, 64],
        "layers_per_block": [1, 1, 1, 1],
        "decoder_layers_per_block": [1, 1, 1, 1],
        "spatio_temporal_scaling": [True, True, True, False],
        "decoder_spatio_temporal_scaling": [True, True, True],
        "decoder_inject_noise": [True, True, True, False],
        "upsample_residual": [True, True, True],
        "upsample_factor": [2, 2, 2],
        "timestep_conditioning": True,
        "patch_size": 1,
        "patch_size_t": 1,
        "encoder_causal": True,
        "decoder_causal": False,
    },
}
