"""Runtime patches of a built upstream `AutoencoderKLWan`, one module per patch, each declaring its `Patch` records.

As for CogVideoX (`cogvideox_torchax.patches`): nothing edits diffusers'
source or classes; each ``apply_*`` changes one concern on one module
instance, idempotently; patched modules still run as upstream when called
eagerly with torch tensors. `cogvideox_torchax.patches.registry` finds
these records too (the family's ``patch_package``). Importing this package
patches nothing.
"""
