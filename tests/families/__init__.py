"""Tests of cogvideox_torchax.families: the family records (test_families.py), and a folder per family with its own."""
