"""Tests of cogvideox_torchax.platforms: the run plan and programs compiled for GPUs and TPUs."""
