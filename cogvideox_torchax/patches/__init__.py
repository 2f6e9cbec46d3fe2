"""What every family's patches share: the `Patch` record, the registry, and the patches any family's module takes.

Nothing here edits diffusers' source or its classes. Each ``apply_*`` function
changes one concern on one module instance, is idempotent, and leaves the
parameters and state-dict keys as they were. Patched modules still run as
upstream when called eagerly with ordinary torch tensors; the JAX paths only
engage for torchax tensors, i.e. inside our jitted decode.

Each patch module declares its `base.Patch` records (``PATCHES``): the
switch (a keyword of `RuntimeOptions`) and its documentation, its stage and
what it follows, when it does not apply, its ``apply``, the compiler options
it needs and the model families it patches. The modules here patch every
family (``conv_bias``, ``silu``, ``group_norm``, ``nearest_upsample``,
``shard_activations``) or hold what the families' own patches build on
(`scan.scan_frames`, `tiling.decode_tiles`); each family's own patches live
in its folder (`cogvideox_torchax.families.cogvideox.patches`,
`cogvideox_torchax.families.wan.patches`, ...). `registry.patches` finds them
all and derives the order; the run plan (`cogvideox_torchax.platforms.build`)
reads only that, and the handbook's list of switches is generated from it.
Importing this package patches nothing.
"""

from __future__ import annotations

from cogvideox_torchax.patches.base import Patch, add_mixin, is_torchax, mixed
from cogvideox_torchax.patches.conv import FusedBiasConv, JaxConv2d, JaxConv3d, apply_conv_bias
from cogvideox_torchax.patches.silu import JaxSiLU, apply_silu
from cogvideox_torchax.patches.upsample import traced_environment
from cogvideox_torchax.patches.width_sharding import ShardedOutputMixin, apply_width_sharding
from cogvideox_torchax.platforms.profiles import KEEP_BARRIERS_COMPILER_OPTIONS

__all__ = [
    "KEEP_BARRIERS_COMPILER_OPTIONS",
    "FusedBiasConv",
    "JaxConv2d",
    "JaxConv3d",
    "JaxSiLU",
    "Patch",
    "ShardedOutputMixin",
    "add_mixin",
    "apply_conv_bias",
    "apply_silu",
    "apply_width_sharding",
    "is_torchax",
    "mixed",
    "traced_environment",
]
