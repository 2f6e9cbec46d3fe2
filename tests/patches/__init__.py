"""Tests of cogvideox_torchax.patches: each patch alone, the frame scan, tiling."""
