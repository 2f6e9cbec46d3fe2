"""Tests of cogvideox_torchax.vae, a file per module: `TorchaxVAE`'s upstream surface and attributes, refusals as
upstream's, its programs and their cache under threads, saving, the stream's refusals.

Each family's decode, encode and stream against upstream: tests/families/<name>/.
"""
