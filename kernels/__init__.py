"""JAX functions that replace hot spots of the upstream PyTorch VAE.

One kernel per module, each beside a pure-jnp ``*_reference`` that the tests
compare it against; import from the module (``from cogvideox_torchax.kernels.group_norm import
group_norm``), so a function never shadows the module it lives in.
"""
