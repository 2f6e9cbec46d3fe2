"""The dtypes a VAE runs in, and named architecture presets.

Architecture lives in the diffusers config (``config.json``); this module
only holds the dtype spellings and every family's named configs for
building the real architecture offline with random weights (`PRESETS`).
How the VAE is run is `cogvideox_torchax.options.RuntimeOptions`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import torch

from cogvideox_torchax import families
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


# Every family's named configs (`cogvideox_torchax.families`), by name:
# the published configs and a tiny one per family for tests. A preset that
# names no ``_class_name`` is CogVideoX's.
PRESETS: dict[str, dict[str, Any]] = {
    name: dict(config) for family in families.FAMILIES.values() for name, config in family.presets.items()
}


def preset_config(name: str) -> dict[str, Any]:
    """Returns a copy of the named preset's diffusers config.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return {k: list(v) if isinstance(v, list) else v for k, v in PRESETS[name].items()}
