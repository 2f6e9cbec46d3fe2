"""`TorchaxVAE` under the module path earlier versions wrote into saved pipelines' ``model_index.json``."""

from cogvideox_torchax.vae.torchax_vae import TorchaxVAE

__all__ = ["TorchaxVAE"]
