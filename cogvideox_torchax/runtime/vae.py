"""`TorchaxVAE` under the module path earlier versions wrote into saved pipelines' ``model_index.json``.

diffusers resolves such a component by this module's attributes: the class,
and the loadable base class it checks the class against (`ModelMixin`).
"""

from diffusers.models.modeling_utils import ModelMixin

from cogvideox_torchax.vae.torchax_vae import TorchaxVAE

__all__ = ["ModelMixin", "TorchaxVAE"]
