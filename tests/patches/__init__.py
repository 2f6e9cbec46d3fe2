"""Tests of cogvideox_torchax.patches: the patches every family takes; each family's own are under tests/families/."""
