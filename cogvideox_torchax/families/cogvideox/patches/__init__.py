"""Runtime patches of a built upstream `AutoencoderKLCogVideoX`, one module per concern, each declaring `Patch` records.

Nothing edits diffusers' source or classes; each ``apply_*`` changes one
concern on one module instance, idempotently, and keeps the parameters and
state-dict keys; patched modules still run as upstream when called eagerly
with torch tensors. `cogvideox_torchax.patches.registry` finds these
records (the family's ``patch_package``) beside the shared ones of
`cogvideox_torchax.patches`. Importing this package patches nothing.
"""
