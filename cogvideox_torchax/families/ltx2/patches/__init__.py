"""Runtime patches of a built upstream `AutoencoderKLLTX2Video` or `AutoencoderKLLTXVideo`, a module per concern.

Upstream decodes the whole video in one call, so LTX-2 needs no frame scan:
the shared patches (`cogvideox_torchax.patches`) and these run on its
modules as they stand. Importing this package patches nothing.
"""
