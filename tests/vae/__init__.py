"""Tests of cogvideox_torchax.vae: `TorchaxVAE`'s decode and encode against upstream, its programs, saving, threads."""
