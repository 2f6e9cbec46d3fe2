"""Tests of cogvideox_torchax.io: videos, frames, latents files and outputs."""
