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

from cogvideox_torchax.budget import MemoryBudgetError, MemoryPlan
from cogvideox_torchax.config import PRESETS, RuntimeOptions
from cogvideox_torchax.loading import ModelLoadError, build, from_pretrained, random_upstream, wrap
from cogvideox_torchax.sharding import make_mesh
from cogvideox_torchax.vae import TorchaxVAE, UnsupportedAttributeError

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
