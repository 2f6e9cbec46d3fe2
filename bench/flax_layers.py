"""The Flax port's building blocks: causal convolution, spatial norm, ResNet block, upsampler, blocks.

Channels-last ``(N, T, H, W, C)`` layers mirroring upstream's module names
(so `bench.flax_weights` maps keys by path); `bench.flax_vae` assembles them
into the decoder and its jitted decode.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

Cache = dict[str, Any]

_DTYPES = {"float32": jnp.float32, "fp32": jnp.float32, "bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16}

# NTHWC activations: batch over "dp", width over "tp" (time is never split:
# every convolution is causal in time and carries a cache across batches).
ACTIVATION_SPEC = PartitionSpec("dp", None, None, "tp", None)


def jax_dtype(dtype: Any) -> Any:
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
        return _DTYPES[dtype.lower()]
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    return jnp.dtype(dtype).type


@dataclasses.dataclass(frozen=True)
class LayerOptions:
    """What every layer needs besides its sizes: dtypes and the activation sharding."""

    dtype: Any
    param_dtype: Any
    sharding: NamedSharding | None  # None: no constraints (no mesh, or one device)

    def constrain(self, x: jax.Array) -> jax.Array:
        if self.sharding is None:
            return x
        return jax.lax.with_sharding_constraint(x, self.sharding)


def _nearest_indices(in_size: int, out_size: int) -> np.ndarray:
    # torch's legacy "nearest" with an output size: src = floor(dst * (in / out))
    # with the scale in float32, clamped to the last input index.
    if in_size == out_size:
        return np.arange(out_size)
    scale = np.float32(in_size) / np.float32(out_size)
    idx = np.floor(np.arange(out_size, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(idx, in_size - 1)


def nearest_resize(x: jax.Array, size: tuple[int, int, int]) -> jax.Array:
    """``F.interpolate(x, size=size)`` (mode "nearest") over the T, H, W axes of NTHWC.

    Integer upscales become `jnp.repeat` (what torch's index rule gives for
    them); anything else gathers with torch's indices.
    """
    for axis, out_size in zip((1, 2, 3), size, strict=True):
        in_size = x.shape[axis]
        if in_size == out_size:
            continue
        idx = _nearest_indices(in_size, out_size)
        if out_size % in_size == 0 and np.array_equal(idx, np.arange(out_size) // (out_size // in_size)):
            x = jnp.repeat(x, out_size // in_size, axis=axis)
        else:
            x = jnp.take(x, jnp.asarray(idx), axis=axis)
    return x


class CausalConv3d(nnx.Module):
    """`CogVideoXCausalConv3d` with ``pad_mode="first"`` (the decoder's only mode).

    Time is padded on the left with the conv cache (the previous batch's last
    ``time_kernel_size - 1`` padded input frames) or, on the first batch, with
    copies of the first frame; height and width are zero-padded by the conv.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, opts: LayerOptions, *, rngs: nnx.Rngs):
        self.time_kernel_size = kernel_size
        pad = (kernel_size - 1) // 2
        # Upstream passes (0, width_pad, height_pad) as Conv3d's (D, H, W)
        # padding; with cubic kernels the two pads are equal.
        self.conv = nnx.Conv(
            in_channels,
            out_channels,
            (kernel_size,) * 3,
            padding=((0, 0), (pad, pad), (pad, pad)),
            dtype=opts.dtype,
            param_dtype=opts.param_dtype,
            rngs=rngs,
        )

    def __call__(self, x: jax.Array, cache: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """Returns ``(output, new_cache)``; ``new_cache`` is None for a time kernel of 1."""
        pad = self.time_kernel_size - 1
        if pad == 0:
            return self.conv(x), None
        past = cache if cache is not None else jnp.repeat(x[:, :1], pad, axis=1)
        x = jnp.concatenate([past.astype(x.dtype), x], axis=1)
        return self.conv(x), x[:, -pad:]


class SpatialNorm3D(nnx.Module):
    """`CogVideoXSpatialNorm3D`: GroupNorm(f) scaled and shifted by convolutions of the latents."""

    def __init__(self, f_channels: int, zq_channels: int, groups: int, opts: LayerOptions, *, rngs: nnx.Rngs):
        # Upstream fixes eps=1e-6 here, whatever the config's norm_eps.
        # Statistics are always fp32 (Flax promotes them), output in dtype.
        self.norm_layer = nnx.GroupNorm(
            f_channels,
            num_groups=groups,
            epsilon=1e-6,
            use_fast_variance=False,
            dtype=opts.dtype,
            param_dtype=opts.param_dtype,
            rngs=rngs,
        )
        self.conv_y = CausalConv3d(zq_channels, f_channels, 1, opts, rngs=rngs)
        self.conv_b = CausalConv3d(zq_channels, f_channels, 1, opts, rngs=rngs)

    def __call__(self, f: jax.Array, zq: jax.Array) -> jax.Array:
        t, h, w = f.shape[1:4]
        if t > 1 and t % 2 == 1:
            # Odd frame counts: the first latent frame maps to the first frame
            # alone, the rest are stretched over the rest.
            zq = jnp.concatenate(
                [nearest_resize(zq[:, :1], (1, h, w)), nearest_resize(zq[:, 1:], (t - 1, h, w))], axis=1
            )
        else:
            zq = nearest_resize(zq, (t, h, w))
        y, _ = self.conv_y(zq)
        b, _ = self.conv_b(zq)
        return self.norm_layer(f) * y + b


class ResnetBlock3D(nnx.Module):
    """`CogVideoXResnetBlock3D` as the decoder builds it (spatial norms, no time embedding)."""

    def __init__(
        self, in_channels: int, out_channels: int, zq_channels: int, groups: int, opts: LayerOptions, *, rngs: nnx.Rngs
    ):
        self.opts = opts
        self.norm1 = SpatialNorm3D(in_channels, zq_channels, groups, opts, rngs=rngs)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, opts, rngs=rngs)
        self.norm2 = SpatialNorm3D(out_channels, zq_channels, groups, opts, rngs=rngs)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, opts, rngs=rngs)
        # Upstream's use_conv_shortcut is False in the decoder: a 1x1x1 conv.
        self.conv_shortcut = (
            nnx.Conv(
                in_channels,
                out_channels,
                (1, 1, 1),
                padding="VALID",
                dtype=opts.dtype,
                param_dtype=opts.param_dtype,
                rngs=rngs,
            )
            if in_channels != out_channels
            else None
        )

    def __call__(self, x: jax.Array, zq: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        cache = cache or {}
        h = nnx.silu(self.norm1(x, zq))
        h, c1 = self.conv1(h, cache.get("conv1"))
        # Dropout is identity at inference.
        h = nnx.silu(self.norm2(h, zq))
        h, c2 = self.conv2(h, cache.get("conv2"))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return self.opts.constrain(h + x), {"conv1": c1, "conv2": c2}


class Upsample3D(nnx.Module):
    """`CogVideoXUpsample3D`: nearest 2x (in time too when ``compress_time``), then a 3x3 conv per frame."""

    def __init__(self, channels: int, compress_time: bool, opts: LayerOptions, *, rngs: nnx.Rngs):
        self.compress_time = compress_time
        # A 2D kernel on NTHWC: Flax folds the T axis into the batch.
        self.conv = nnx.Conv(
            channels,
            channels,
            (3, 3),
            padding=((1, 1), (1, 1)),
            dtype=opts.dtype,
            param_dtype=opts.param_dtype,
            rngs=rngs,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        t = x.shape[1]

        def space2x(v):
            return jnp.repeat(jnp.repeat(v, 2, axis=2), 2, axis=3)

        if self.compress_time and t > 1 and t % 2 == 1:
            # The first frame is only upscaled in space; the rest doubles in time.
            x = jnp.concatenate([space2x(x[:, :1]), jnp.repeat(space2x(x[:, 1:]), 2, axis=1)], axis=1)
        elif self.compress_time and t > 1:
            x = jnp.repeat(space2x(x), 2, axis=1)
        else:
            x = space2x(x)
        return self.conv(x)


class UpBlock3D(nnx.Module):
    """`CogVideoXUpBlock3D`: resnets, then an optional upsampler."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_layers: int,
        zq_channels: int,
        groups: int,
        add_upsample: bool,
        compress_time: bool,
        opts: LayerOptions,
        *,
        rngs: nnx.Rngs,
    ):
        self.opts = opts
        self.resnets = nnx.List(
            [
                ResnetBlock3D(
                    in_channels if i == 0 else out_channels, out_channels, zq_channels, groups, opts, rngs=rngs
                )
                for i in range(num_layers)
            ]
        )
        self.upsamplers = nnx.List([Upsample3D(out_channels, compress_time, opts, rngs=rngs)]) if add_upsample else None

    def __call__(self, x: jax.Array, zq: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        cache = cache or {}
        new_cache = {}
        for i, resnet in enumerate(self.resnets):
            x, new_cache[f"resnet_{i}"] = resnet(x, zq, cache.get(f"resnet_{i}"))
        if self.upsamplers is not None:
            for upsampler in self.upsamplers:
                x = upsampler(x)
        return self.opts.constrain(x), new_cache


class MidBlock3D(nnx.Module):
    """`CogVideoXMidBlock3D`: resnets at the latent resolution."""

    def __init__(self, channels: int, num_layers: int, zq_channels: int, groups: int, opts: LayerOptions, *, rngs):
        self.resnets = nnx.List(
            [ResnetBlock3D(channels, channels, zq_channels, groups, opts, rngs=rngs) for _ in range(num_layers)]
        )

    def __call__(self, x: jax.Array, zq: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        cache = cache or {}
        new_cache = {}
        for i, resnet in enumerate(self.resnets):
            x, new_cache[f"resnet_{i}"] = resnet(x, zq, cache.get(f"resnet_{i}"))
        return x, new_cache
