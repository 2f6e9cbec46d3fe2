"""The VAE facade and its programs: `TorchaxVAE`, the patched module's jitted programs, their caches, saving."""
