"""Module paths of earlier versions that saved files name; nothing else lives here.

A diffusers pipeline saved with an earlier version's `TorchaxVAE` names
``["cogvideox_torchax.runtime.vae", "TorchaxVAE"]`` in its
``model_index.json``; `cogvideox_torchax.runtime.vae` keeps that name
importable so such folders still load.
"""
