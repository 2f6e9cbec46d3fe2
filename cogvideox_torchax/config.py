"""The dtypes a VAE runs in, and named architecture presets.

Architecture lives in the diffusers config (``config.json``); this module
only holds the dtype spellings and a few named configs for building the real
architecture offline with random weights (`PRESETS`). How the VAE is run is
`cogvideox_torchax.options.RuntimeOptions`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import torch

from cogvideox_torchax.spellings import dtype_name

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# The dtypes a VAE runs in; bfloat16 and float16 are the "low precision"
# ones, which every patch and kernel treats alike (fp32 statistics and
# accumulation, one rounding per op).
DTYPES = tuple(_TORCH_DTYPES)
LOW_PRECISION = ("bfloat16", "float16")


def canonical_dtype(dtype: str | torch.dtype) -> str:
    """Returns ``"float32"``, ``"bfloat16"`` or ``"float16"`` for any accepted spelling.

    Raises:
        ValueError: for any other dtype.
    """
    if isinstance(dtype, torch.dtype):
        for name, td in _TORCH_DTYPES.items():
            if td == dtype:
                return name
    return dtype_name(dtype)


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


def preset_config(name: str) -> dict[str, Any]:
    """Returns a copy of the named preset's diffusers config.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return {k: list(v) if isinstance(v, list) else v for k, v in PRESETS[name].items()}
