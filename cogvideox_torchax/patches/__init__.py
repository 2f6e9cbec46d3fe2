"""Runtime patches of a built upstream `AutoencoderKLCogVideoX`, one module per patch family.

Nothing here edits diffusers' source or its classes. Each ``apply_*`` function
changes one concern on one module instance, is idempotent, and leaves the
parameters and state-dict keys as they were. Patched modules still run as
upstream when called eagerly with ordinary torch tensors; the JAX paths only
engage for torchax tensors, i.e. inside our jitted decode.

Each family module declares its `base.Patch` records (``PATCHES``): the
switch (a keyword of `RuntimeOptions`) and its documentation, its stage and
what it follows, when it does not apply, its ``apply``, and the compiler
options it needs. `registry.patches` finds them and derives the order; the
run plan (`cogvideox_torchax.platforms.build`) reads only that, and the
handbook's list of switches is generated from it. Importing this package
patches nothing.
"""

from __future__ import annotations

from cogvideox_torchax.patches.base import Patch, add_mixin, is_torchax
from cogvideox_torchax.patches.causal_conv import (
    CacheFirstCausalConv3d,
    CachelessCausalConv3d,
    TimeTapCausalConv3d,
    apply_cache_first,
    apply_conv_cache_trim,
    apply_time_tap_conv,
)
from cogvideox_torchax.patches.conv import (
    ChunkFreeSafeConv3d,
    FusedBiasConv,
    JaxChunkFreeSafeConv3d,
    JaxConv2d,
    JaxConv3d,
    JaxSafeConv3d,
    apply_conv_bias,
    apply_safe_conv,
)
from cogvideox_torchax.patches.frame_scan import apply_frame_scan
from cogvideox_torchax.patches.leaf_ops import JaxGroupNorm, JaxSiLU, apply_group_norm, apply_silu
from cogvideox_torchax.patches.resample import apply_resample_conv3d
from cogvideox_torchax.patches.spatial_norm import LowResSpatialNorm3D, apply_low_res_spatial_norm
from cogvideox_torchax.patches.tiling import apply_tile_batching
from cogvideox_torchax.patches.time_chunks import TimeChunkedResnetBlock3D, apply_time_chunks
from cogvideox_torchax.patches.upsample import traced_environment
from cogvideox_torchax.patches.width_sharding import ShardedOutputMixin, apply_width_sharding
from cogvideox_torchax.platforms.profiles import KEEP_BARRIERS_COMPILER_OPTIONS

__all__ = [
    "KEEP_BARRIERS_COMPILER_OPTIONS",
    "CacheFirstCausalConv3d",
    "CachelessCausalConv3d",
    "ChunkFreeSafeConv3d",
    "FusedBiasConv",
    "JaxChunkFreeSafeConv3d",
    "JaxConv2d",
    "JaxConv3d",
    "JaxGroupNorm",
    "JaxSafeConv3d",
    "JaxSiLU",
    "LowResSpatialNorm3D",
    "Patch",
    "ShardedOutputMixin",
    "TimeChunkedResnetBlock3D",
    "TimeTapCausalConv3d",
    "add_mixin",
    "apply_cache_first",
    "apply_conv_bias",
    "apply_conv_cache_trim",
    "apply_frame_scan",
    "apply_group_norm",
    "apply_low_res_spatial_norm",
    "apply_resample_conv3d",
    "apply_safe_conv",
    "apply_silu",
    "apply_tile_batching",
    "apply_time_chunks",
    "apply_time_tap_conv",
    "apply_width_sharding",
    "is_torchax",
    "traced_environment",
]
