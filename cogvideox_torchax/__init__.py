"""CogVideoX's upstream PyTorch VAE on JAX through torchax.

Public API::

    vae = cogvideox_torchax.from_pretrained("path/or/hub-id", subfolder="vae",
                                            dtype="bfloat16", mesh="dp=1,tp=8")
    video = vae.decode(latents).sample          # torch tensor, as upstream
    latents = vae.encode(video).latent_dist.mode()

    pipe.vae = cogvideox_torchax.wrap(pipe.vae)  # an already-built module

Command lines: ``python -m cogvideox_torchax.decode`` and
``python -m cogvideox_torchax.encode``.

Importing this package patches nothing; the ``apply_*`` functions in
`cogvideox_torchax.patches` act only on the modules they are given.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module it lives in. Resolved on first use (PEP 562), so
# importing the package (as `python -m cogvideox_torchax.decode` does before
# its own code runs) does not load torch, JAX and diffusers: the command
# lines install their Ctrl-C handling first.
_EXPORTS = {
    "MemoryBudgetError": "cogvideox_torchax.memory.budget",
    "MemoryPlan": "cogvideox_torchax.memory.budget",
    "PRESETS": "cogvideox_torchax.config",
    "RuntimeOptions": "cogvideox_torchax.options",
    "ModelLoadError": "cogvideox_torchax.io.model_files",
    "build": "cogvideox_torchax.loading",
    "from_pretrained": "cogvideox_torchax.loading",
    "random_upstream": "cogvideox_torchax.loading",
    "wrap": "cogvideox_torchax.loading",
    "make_mesh": "cogvideox_torchax.parallel.sharding",
    # Through loading, which also imports the path saved pipelines name it by.
    "TorchaxVAE": "cogvideox_torchax.loading",
    "UnsupportedAttributeError": "cogvideox_torchax.vae.torchax_vae",
}

__all__ = [
    "PRESETS",
    "MemoryBudgetError",
    "MemoryPlan",
    "ModelLoadError",
    "RuntimeOptions",
    "TorchaxVAE",
    "UnsupportedAttributeError",
    "build",
    "from_pretrained",
    "make_mesh",
    "random_upstream",
    "wrap",
]

if TYPE_CHECKING:
    from cogvideox_torchax.config import PRESETS
    from cogvideox_torchax.io.model_files import ModelLoadError
    from cogvideox_torchax.loading import build, from_pretrained, random_upstream, wrap
    from cogvideox_torchax.memory.budget import MemoryBudgetError, MemoryPlan
    from cogvideox_torchax.options import RuntimeOptions
    from cogvideox_torchax.parallel.sharding import make_mesh
    from cogvideox_torchax.vae.torchax_vae import TorchaxVAE, UnsupportedAttributeError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        # Before JAX starts: a machine without accelerators gets the CPU
        # backend without the compiler extra's plugins starting (and printing).
        from cogvideox_torchax.platforms.accelerators import use_cpu_without_accelerators

        use_cpu_without_accelerators()
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cogvideox_torchax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
