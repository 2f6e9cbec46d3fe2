"""Running over many devices and hosts: the ``(dp, tp)`` mesh and `jax.distributed`."""
