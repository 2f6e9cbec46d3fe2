"""Runtime options and named architecture presets.

Architecture lives in the diffusers config (``config.json``); this module only
holds how we run it (`RuntimeOptions`) and a few named configs for building
the real architecture offline with random weights (`PRESETS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import torch

from cogvideox_torchax.spellings import dtype_name

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# The dtypes a VAE runs in; bfloat16 and float16 are the "low precision"
# ones, which every patch and kernel treats alike (fp32 statistics and
# accumulation, one rounding per op).
DTYPES = tuple(_TORCH_DTYPES)
LOW_PRECISION = ("bfloat16", "float16")


def canonical_dtype(dtype: str | torch.dtype) -> str:
    """Returns ``"float32"``, ``"bfloat16"`` or ``"float16"`` for any accepted spelling.

    Raises:
        ValueError: for any other dtype.
    """
    if isinstance(dtype, torch.dtype):
        for name, td in _TORCH_DTYPES.items():
            if td == dtype:
                return name
    return dtype_name(dtype)


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """How the upstream VAE is run; validated on construction.

    Every switch below is ``None`` (the default: on wherever
    `cogvideox_torchax.platforms.run_plan` says it applies to the target), ``True`` (on;
    building a VAE for a target where it cannot apply raises ValueError
    saying why) or ``False`` (off, for comparison). ``vae.plan`` lists what
    runs.

    Attributes:
        dtype: compute and weight dtype, ``"float32"``, ``"bfloat16"`` or
            ``"float16"`` (fp16 overflows above 65504; the commands refuse
            latents out of range and a result holding NaN/Inf, exit 2).
        group_norm: replace `nn.GroupNorm` with `kernels.group_norm` (fp32
            statistics, no full-size fp32 copy). False keeps torchax's
            lowering of the upstream op, for comparison.
        silu: replace `nn.SiLU` with `kernels.silu` (rounds once in bf16 and fp16,
            as torch does; torchax's lowering rounds twice).
        conv_bias: run every convolution through `kernels.conv` with the
            target's `kernels.conv.ConvPolicy` (layout, bias rounding,
            splitting of convolutions too large for cuDNN); False keeps
            torchax's lowering.
        nearest_upsample: ``F.interpolate(mode="nearest")`` by
            `kernels.upsample.nearest`, in the activation dtype (torchax's
            fallback gathers from an fp32 copy).
        trim_conv_cache: time-kernel-1 causal convs return no conv cache
            (upstream returns, and never reads, their whole input).
        cache_first: causal convs take their conv cache before convolving,
            ordered by optimization barriers (`patches.CacheFirstCausalConv3d`),
            so chained decoder calls do not keep each call's full-size
            activations alive (92 GB instead of ~16 GB at 49 frames 480x720).
        time_tap_conv: causal convs run as one 2-D convolution per time tap
            and carry partial sums as their conv cache
            (`patches.TimeTapCausalConv3d`, ~1.5x faster convs on XLA:CPU).
            CPU and fp32 only. Needs ``cache_first``.
        resample_conv3d: the upsamplers and downsamplers resize and
            convolve ``(B, C, T, H, W)`` as it stands, one 3-D convolution
            of kernel depth 1 (`cogvideox_torchax.patches.resample`), instead of
            moving frames next to the batch for a 2-D convolution: on
            CUDA, XLA lays 2-D convolutions out NHWC and 3-D ones NCDHW,
            and the islands cost activation-sized transposes; on TPU the
            program needs less memory. CUDA and TPU; needs ``conv_bias``.
        low_res_spatial_norm: SpatialNorm's 1x1x1 ``conv_y``/``conv_b`` run
            on ``zq`` before its nearest resize, not after
            (`patches.LowResSpatialNorm3D`): the same values without two
            full-size tensors per norm. Meshes with ``tp=1`` only.
        frame_scan: decode and encode the frame batches after the first
            with one `jax.lax.scan` (compile time independent of length);
            False keeps upstream's loops, unrolled into the jit. Needs
            ``trim_conv_cache``.
        tile_batching: when tiling is enabled (`TorchaxVAE.enable_tiling`),
            decode equal-shape tiles together, one per ``dp`` replica per
            scan step; False traces upstream's loop, one decoder per tile.
        chunk_free_conv: run `CogVideoXSafeConv3d` as one convolution instead
            of upstream's memory-size chunking. On a GPU only together with
            ``conv_bias``, whose kernel splits what cuDNN cannot take.
        shard_activations: constrain activations to split width over ``tp``
            and batch over ``dp``; meshes of more than one device.
        time_chunks: the decoder's resnet blocks convolve in time chunks
            whose inputs are built straight from the block input
            (`patches.TimeChunkedResnetBlock3D`): no padded input stored
            whole (H200, bf16: 1.5 at (1,16,21,96,170) 20.40 -> 15.61 GiB,
            2b at (1,16,13,60,90) 6.44 -> 5.80 GiB of temporaries). CUDA
            only; needs ``group_norm``, ``conv_bias``, ``cache_first`` and
            ``low_res_spatial_norm``.
        conv_split_elements: split any convolution whose input or output
            would hold more elements than this (`kernels.conv.ConvPolicy`);
            None takes the target's limit (below 2^31 on GPUs, below 2^31
            per device on TPUs, none on the CPU). Needs ``conv_bias``.
        patches: switches by name for registered patches that have no field
            above (`cogvideox_torchax.patches.registry`): a patch module
            declares its switch and nothing here changes, e.g.
            ``patches={"my_patch": False}``. A name with a field of its own,
            or no registered patch, raises ValueError. Kept as sorted
            ``(name, value)`` pairs, so the options stay hashable.
    """

    dtype: str = "float32"
    group_norm: bool | None = None
    silu: bool | None = None
    conv_bias: bool | None = None
    nearest_upsample: bool | None = None
    trim_conv_cache: bool | None = None
    cache_first: bool | None = None
    time_tap_conv: bool | None = None
    resample_conv3d: bool | None = None
    low_res_spatial_norm: bool | None = None
    frame_scan: bool | None = None
    tile_batching: bool | None = None
    chunk_free_conv: bool | None = None
    shard_activations: bool | None = None
    time_chunks: bool | None = None
    conv_split_elements: int | None = None
    patches: Mapping[str, bool | None] | tuple[tuple[str, bool], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "patches", _named_switches(self.patches, self.switches()))
        for name in self.switches():
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be None, True or False, got {getattr(self, name)!r}")
        split = self.conv_split_elements
        if split is not None and (isinstance(split, bool) or not isinstance(split, int) or split < 1):
            raise ValueError(f"conv_split_elements must be a positive int or None, got {split!r}")
        for name, needs in (("time_tap_conv", "cache_first"), ("frame_scan", "trim_conv_cache")):
            if getattr(self, name) and getattr(self, needs) is False:
                raise ValueError(f"{name}=True needs {needs} (not False)")
        if split is not None and self.conv_bias is False:
            raise ValueError("conv_split_elements needs conv_bias (its kernel does the splitting)")

    @classmethod
    def switches(cls) -> tuple[str, ...]:
        """The switches with a field of their own: every field but ``dtype``, ``conv_split_elements``, ``patches``."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _NOT_SWITCHES)

    def switch(self, name: str) -> bool | None:
        """How the patch switch ``name`` is set: its field, else its entry in ``patches``; None is auto."""
        if name in self.switches():
            return getattr(self, name)
        return dict(self.patches).get(name)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.dtype]

    @property
    def jax_dtype(self) -> Any:
        return _JAX_DTYPES[self.dtype]


_NOT_SWITCHES = ("dtype", "conv_split_elements", "patches")


def _named_switches(given: Any, fields: tuple[str, ...]) -> tuple[tuple[str, bool], ...]:
    """Checks `RuntimeOptions.patches` and keeps it as sorted pairs (None, auto, is left out)."""
    pairs = given.items() if isinstance(given, Mapping) else given
    try:
        named = dict(pairs)
    except (TypeError, ValueError):
        raise TypeError(f"patches must map switch names to True, False or None, got {given!r}") from None
    for name, value in named.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"patches[{name!r}] must be None, True or False, got {value!r}")
        if name in fields:
            raise ValueError(f"{name!r} has a field of its own: RuntimeOptions({name}=...), not patches=")
    named = {name: value for name, value in named.items() if value is not None}
    if named:
        # Imported here: the patch modules import this one.
        from cogvideox_torchax.patches.registry import patches

        known = {p.option for p in patches()}
        unknown = sorted(set(named) - known)
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise ValueError(f"no registered patch answers to {names}; known: {', '.join(sorted(known))}")
    return tuple(sorted(named.items()))


_FOUR_BLOCKS = {
    "down_block_types": ["CogVideoXDownBlock3D"] * 4,
    "up_block_types": ["CogVideoXUpBlock3D"] * 4,
}

# The VAE configs published with the CogVideoX checkpoints (vae/config.json);
# 2b and 5b differ only in the latent scaling factor.
PRESETS: dict[str, dict[str, Any]] = {
    "cogvideox-2b": {
        **_FOUR_BLOCKS,
        "block_out_channels": [128, 256, 256, 512],
        "latent_channels": 16,
        "layers_per_block": 3,
        "norm_num_groups": 32,
        "norm_eps": 1e-6,
        "temporal_compression_ratio": 4,
        "sample_height": 480,
        "sample_width": 720,
        "scaling_factor": 1.15258426,
    },
    "cogvideox-5b": {
        **_FOUR_BLOCKS,
        "block_out_channels": [128, 256, 256, 512],
        "latent_channels": 16,
        "layers_per_block": 3,
        "norm_num_groups": 32,
        "norm_eps": 1e-6,
        "temporal_compression_ratio": 4,
        "sample_height": 480,
        "sample_width": 720,
        "scaling_factor": 0.7,
    },
    # CogVideoX 1.5's VAE (vae/config.json of the 1.5 checkpoints): the same
    # architecture at 768x1360, scaling factor 0.7, and invert_scale_latents,
    # which its image-to-video pipeline reads when it scales the image's
    # latents (decoding divides by the scaling factor as for 1.0).
    "cogvideox-1.5": {
        **_FOUR_BLOCKS,
        "block_out_channels": [128, 256, 256, 512],
        "latent_channels": 16,
        "layers_per_block": 3,
        "norm_num_groups": 32,
        "norm_eps": 1e-6,
        "temporal_compression_ratio": 4,
        "sample_height": 768,
        "sample_width": 1360,
        "scaling_factor": 0.7,
        "invert_scale_latents": True,
    },
    # diffusers' own CogVideoX VAE test config: every code path, tiny widths.
    "tiny": {
        **_FOUR_BLOCKS,
        "block_out_channels": [8, 8, 8, 8],
        "latent_channels": 4,
        "layers_per_block": 1,
        "norm_num_groups": 2,
        "temporal_compression_ratio": 4,
    },
}


def preset_config(name: str) -> dict[str, Any]:
    """Returns a copy of the named preset's diffusers config.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return {k: list(v) if isinstance(v, list) else v for k, v in PRESETS[name].items()}
