"""Wan's named VAE configs: the published checkpoints' ``vae/config.json`` and diffusers' test config.

Each carries ``_class_name`` so that a preset, like a config file, names its
family. Keys left out take `AutoencoderKLWan`'s defaults, which are Wan
2.1's published values.
"""

from __future__ import annotations

from typing import Any

_WAN = {"_class_name": "AutoencoderKLWan"}

PRESETS: dict[str, dict[str, Any]] = {
    # Wan 2.1 (T2V 1.3B and 14B, I2V) and Wan 2.2 A14B share this VAE:
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/config.json, whose values are
    # AutoencoderKLWan's defaults in diffusers 0.42 (base_dim 96, z_dim 16,
    # dim_mult [1, 2, 4, 4], num_res_blocks 2, temperal_downsample
    # [false, true, true], the 16 latents_mean / latents_std).
    "wan2.1": {
        **_WAN,
        "base_dim": 96,
        "z_dim": 16,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 2,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "dropout": 0.0,
    },
    # Wan 2.2 TI2V-5B: Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json, as
    # diffusers' scripts/convert_wan_to_diffusers.py (vae22_diffusers_config)
    # writes it: residual blocks, 48 latent channels, pixels patchified 2x2
    # (12 channels in and out), 16x spatial compression. That script also
    # writes "clip_output": false, a key diffusers 0.42's class does not take.
    "wan2.2-ti2v-5b": {
        **_WAN,
        "base_dim": 160,
        "decoder_base_dim": 256,
        "z_dim": 48,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 2,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "dropout": 0.0,
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_spatial": 16,
        "scale_factor_temporal": 4,
        "latents_mean": [
            -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
            -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
            -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
            -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
            -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
            0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
        ],
        "latents_std": [
            0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
            0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
            0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
            0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
            0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
            0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
        ],
    },
    # diffusers' own AutoencoderKLWan test config
    # (tests/models/autoencoders/test_models_autoencoder_wan.py): every code
    # path of Wan 2.1's architecture, 3 base channels.
    "wan-tiny": {
        **_WAN,
        "base_dim": 3,
        "z_dim": 16,
        "dim_mult": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "temperal_downsample": [False, True, True],
    },
}
