"""Tests of cogvideox_torchax.parallel: several processes as one `jax.distributed` cluster."""
