"""JAX functions that replace hot spots of the upstream PyTorch VAE.

Each kernel sits beside a pure-jnp ``*_reference`` that the tests compare it
against.
"""

from kernels.group_norm import group_norm, group_norm_reference

__all__ = ["group_norm", "group_norm_reference"]
