"""Tests of cogvideox_torchax.kernels against torch and their own references."""
