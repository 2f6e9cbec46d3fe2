"""Measuring instruments: the decode benchmark (`python -m bench.decode`).

Not part of the product; nothing in `cogvideox_torchax` imports from here.
"""
