"""The benchmark's Flax peer: the CogVideoX VAE decoder written in Flax NNX.

A port of diffusers' ``AutoencoderKLCogVideoX`` decode path (``_decode`` and
``CogVideoXDecoder3D`` with its blocks), written the way a Flax user would:
channels-last ``(N, T, H, W, C)`` activations, `nnx.Conv` / `nnx.GroupNorm`
layers, weights passed to one `jax.jit` as arguments. It keeps upstream's
numerics and frame handling exactly:

* latent frames are decoded in batches of two, the first batch taking the
  ``T % 2`` extra frame, and every causal convolution carries its last
  ``time_kernel_size - 1`` padded input frames to the next batch (the first
  batch pads by repeating its first frame); the batches after the first run
  in one `jax.lax.scan` carrying that cache;
* time-compressing upsamplers and the spatial norms treat the first frame of
  an odd-length batch separately, as upstream does;
* outputs are not clamped (upstream returns raw values).

Two deliberate differences, neither changing the result: upstream's
`CogVideoXSafeConv3d` splits inputs over 2 GB into overlapping time chunks
(mathematically the same convolution; here one convolution), and the kernel-1
causal convolutions of the spatial norms return no conv cache (upstream returns
their whole input as a cache that nothing reads).

The public surface is `FlaxCogVideoXDecoder` (the module), `from_upstream`
(build and load from a diffusers module) and `FlaxVAE` (the jitted decode).
The torch -> NNX key map lives in `bench.flax_weights`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bench.flax_weights import convert_state_dict

Cache = dict[str, Any]

_DTYPES = {"float32": jnp.float32, "fp32": jnp.float32, "bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16}

# NTHWC activations: batch over "dp", width over "tp" (time is never split:
# every convolution is causal in time and carries a cache across batches).
ACTIVATION_SPEC = PartitionSpec("dp", None, None, "tp", None)


def _jax_dtype(dtype: Any) -> Any:
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
        return _DTYPES[dtype.lower()]
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    return jnp.dtype(dtype).type


@dataclasses.dataclass(frozen=True)
class _Options:
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

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, opts: _Options, *, rngs: nnx.Rngs):
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

    def __init__(self, f_channels: int, zq_channels: int, groups: int, opts: _Options, *, rngs: nnx.Rngs):
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
        self, in_channels: int, out_channels: int, zq_channels: int, groups: int, opts: _Options, *, rngs: nnx.Rngs
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

    def __init__(self, channels: int, compress_time: bool, opts: _Options, *, rngs: nnx.Rngs):
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
        opts: _Options,
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

    def __init__(self, channels: int, num_layers: int, zq_channels: int, groups: int, opts: _Options, *, rngs):
        self.resnets = nnx.List(
            [ResnetBlock3D(channels, channels, zq_channels, groups, opts, rngs=rngs) for _ in range(num_layers)]
        )

    def __call__(self, x: jax.Array, zq: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        cache = cache or {}
        new_cache = {}
        for i, resnet in enumerate(self.resnets):
            x, new_cache[f"resnet_{i}"] = resnet(x, zq, cache.get(f"resnet_{i}"))
        return x, new_cache


class Decoder3D(nnx.Module):
    """`CogVideoXDecoder3D`: one frame batch of latents to frames, threading the conv cache."""

    def __init__(self, config: Mapping[str, Any], opts: _Options, *, rngs: nnx.Rngs):
        if config.get("act_fn", "silu") != "silu":
            raise ValueError(f"only act_fn='silu' is ported, got {config['act_fn']!r}")
        if any(t != "CogVideoXUpBlock3D" for t in config["up_block_types"]):
            raise ValueError(f"only CogVideoXUpBlock3D up blocks exist upstream, got {config['up_block_types']}")
        zq = config["latent_channels"]
        groups = config["norm_num_groups"]
        channels = list(reversed(config["block_out_channels"]))
        self.conv_in = CausalConv3d(zq, channels[0], 3, opts, rngs=rngs)
        self.mid_block = MidBlock3D(channels[0], 2, zq, groups, opts, rngs=rngs)
        compress_levels = int(np.log2(config["temporal_compression_ratio"]))
        self.time_upsamples = min(compress_levels, len(channels) - 1)
        blocks = []
        prev = channels[0]
        for i, out in enumerate(channels):
            blocks.append(
                UpBlock3D(
                    prev,
                    out,
                    config["layers_per_block"] + 1,
                    zq,
                    groups,
                    add_upsample=i != len(channels) - 1,
                    compress_time=i < compress_levels,
                    opts=opts,
                    rngs=rngs,
                )
            )
            prev = out
        self.up_blocks = nnx.List(blocks)
        self.norm_out = SpatialNorm3D(channels[-1], zq, groups, opts, rngs=rngs)
        self.conv_out = CausalConv3d(channels[-1], config["out_channels"], 3, opts, rngs=rngs)

    def __call__(self, sample: jax.Array, cache: Cache | None = None) -> tuple[jax.Array, Cache]:
        """Decodes one frame batch ``(N, T, h, w, latent_channels)``; returns ``(frames, new_cache)``."""
        cache = cache or {}
        new_cache = {}
        x, new_cache["conv_in"] = self.conv_in(sample, cache.get("conv_in"))
        x, new_cache["mid_block"] = self.mid_block(x, sample, cache.get("mid_block"))
        for i, block in enumerate(self.up_blocks):
            x, new_cache[f"up_block_{i}"] = block(x, sample, cache.get(f"up_block_{i}"))
        x = nnx.silu(self.norm_out(x, sample))
        x, new_cache["conv_out"] = self.conv_out(x, cache.get("conv_out"))
        return x, new_cache


class FlaxCogVideoXDecoder(nnx.Module):
    """The decode half of `AutoencoderKLCogVideoX`, on channels-last ``(N, T, H, W, C)`` arrays.

    Attribute names follow upstream's module names (``decoder.up_blocks[0]...``)
    so that `bench.flax_weights` maps each torch key to one NNX path.

    Args:
        config: the upstream diffusers config (``upstream.config``, or a dict).
        dtype: compute dtype, float32 or bfloat16.
        param_dtype: weight dtype; defaults to ``dtype``.
        mesh: optional ``("dp", "tp")`` mesh; activations are constrained to
            batch over ``dp`` and width over ``tp`` when it has more than one
            device.
        rngs: initialises the weights (use `nnx.eval_shape` to skip that when
            loading weights anyway, as `from_upstream` does).
    """

    # Upstream's `num_latent_frames_batch_size`: "setting it to anything other
    # than 2 would give poor results" (the VAE was trained on it).
    frame_batch_size = 2

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        dtype: Any = "float32",
        param_dtype: Any = None,
        mesh: Mesh | None = None,
        rngs: nnx.Rngs,
    ):
        dtype = _jax_dtype(dtype)
        param_dtype = dtype if param_dtype is None else _jax_dtype(param_dtype)
        opts = _Options(dtype, param_dtype, activation_sharding(mesh))
        self.opts = opts
        self.decoder = Decoder3D(config, opts, rngs=rngs)
        # Upstream builds post_quant_conv with out_channels (not latent
        # channels) in and out; kept as is so its weights load.
        self.post_quant_conv = (
            nnx.Conv(
                config["out_channels"],
                config["out_channels"],
                (1, 1, 1),
                padding="VALID",
                dtype=dtype,
                param_dtype=param_dtype,
                rngs=rngs,
            )
            if config.get("use_post_quant_conv", False)
            else None
        )

    def _decode_batch(self, chunk: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        if self.post_quant_conv is not None:
            chunk = self.post_quant_conv(chunk)
        return self.decoder(chunk, cache)

    def __call__(self, z: jax.Array) -> jax.Array:
        """Decodes unscaled latents ``(N, T, h, w, C)`` to frames ``(N, F, 8h, 8w, 3)``, as upstream's ``_decode``.

        The first frame batch (``2 + T % 2`` frames, or all of them when
        ``T < 2``) runs alone, without a conv cache; the remaining pairs of
        frames run in one `jax.lax.scan` with the conv cache as its carry,
        each writing its frames into the output in place. Same batches, same
        cache as upstream's loop; one traced decoder per batch shape (compile
        time does not grow with T), and one batch's activations live at a time.
        """
        z = self.opts.constrain(z.astype(self.opts.dtype))
        num_frames = z.shape[1]
        size = self.frame_batch_size
        num_batches = max(num_frames // size, 1)
        first, cache = self._decode_batch(z[:, : size + num_frames % size], None)
        if num_batches == 1:
            return self.opts.constrain(first)
        # Every later batch has `size` latent frames; each time-compressing
        # upsampler doubles an even frame count.
        batch_frames = size * 2**self.decoder.time_upsamples
        video = jnp.zeros(
            (first.shape[0], first.shape[1] + (num_batches - 1) * batch_frames, *first.shape[2:]), first.dtype
        )
        video = jax.lax.dynamic_update_slice_in_dim(self.opts.constrain(video), first, 0, axis=1)
        start = size + num_frames % size

        def step(carry, i):
            cache, video = carry
            chunk = jax.lax.dynamic_slice_in_dim(z, start + i * size, size, axis=1)
            out, cache = self._decode_batch(chunk, cache)
            video = jax.lax.dynamic_update_slice_in_dim(video, out, first.shape[1] + i * batch_frames, axis=1)
            return (cache, video), None

        (_, video), _ = jax.lax.scan(step, (cache, video), jnp.arange(num_batches - 1))
        return self.opts.constrain(video)


def _auto_mesh(mesh: Mesh | None) -> Mesh | None:
    if mesh is None:
        return None
    if tuple(mesh.axis_names) != ("dp", "tp"):
        raise ValueError(f"mesh axes must be ('dp', 'tp'), got {tuple(mesh.axis_names)}")
    # Same devices with Auto axes: `jax.make_mesh` gives Explicit axes, which
    # reject `with_sharding_constraint` on unsharded-typed activations.
    return Mesh(mesh.devices, ("dp", "tp"))


def activation_sharding(mesh: Mesh | None) -> NamedSharding | None:
    """NTHWC activations' sharding on ``mesh``, or None when there is nothing to split."""
    mesh = _auto_mesh(mesh)
    if mesh is None or math.prod(mesh.devices.shape) == 1:
        return None
    return NamedSharding(mesh, ACTIVATION_SPEC)


class FlaxVAE:
    """A loaded `FlaxCogVideoXDecoder` and its jitted decode.

    The jitted function takes and returns torch's layout, ``(B, C, T, H, W)``
    latents to ``(B, 3, F, 8H, 8W)`` frames, transposing once on entry and
    once on exit; everything between is NTHWC. Weights are its first
    argument (``state``), not constants baked into the program.

    Attributes:
        graphdef: the module structure from `nnx.split`.
        state: the weights (`nnx.State`), replicated over the mesh if any.
        mesh: the ``("dp", "tp")`` mesh, or None.
        dtype: the compute dtype (also the latents' dtype inside the jit).
    """

    def __init__(self, model: FlaxCogVideoXDecoder, mesh: Mesh | None = None):
        self.mesh = _auto_mesh(mesh)
        self.dtype = model.opts.dtype
        self.graphdef, state = nnx.split(model)
        if self.mesh is not None:
            state = jax.device_put(state, NamedSharding(self.mesh, PartitionSpec()))
        self.state = state
        self._jitted = self._build()

    def _build(self) -> Callable:
        graphdef, dtype = self.graphdef, self.dtype

        def decode(state: nnx.State, z: jax.Array) -> jax.Array:
            model = nnx.merge(graphdef, state)
            # The API boundary: one transpose in, one out.
            video = model(jnp.transpose(z.astype(dtype), (0, 2, 3, 4, 1)))
            return jnp.transpose(video, (0, 4, 1, 2, 3))

        return jax.jit(decode)

    def _latent_sharding(self, shape: tuple[int, ...]) -> NamedSharding | None:
        # Where latents enter: batch over dp, width over tp, each only where it
        # divides (placed arrays must split evenly; the constraints inside the
        # jit need not).
        if self.mesh is None:
            return None
        dp, tp = self.mesh.devices.shape
        batch = "dp" if shape[0] % dp == 0 else None
        width = "tp" if shape[4] % tp == 0 else None
        return NamedSharding(self.mesh, PartitionSpec(batch, None, None, None, width))

    def decode_fn(self) -> Callable[[nnx.State, jax.Array], jax.Array]:
        """The `jax.jit`-ed ``(state, z_ncthw) -> video_ncthw``; call ``.lower(...)`` on it freely."""
        return self._jitted

    def lower(self, shape: tuple[int, int, int, int, int]) -> jax.stages.Lowered:
        """Lowers the decode for latents of torch shape ``(B, C, T, H, W)`` in the compute dtype."""
        z = jax.ShapeDtypeStruct(tuple(shape), self.dtype, sharding=self._latent_sharding(tuple(shape)))
        return self._jitted.lower(self.state, z)

    def decode(self, z: Any) -> jax.Array:
        """Decodes unscaled latents ``(B, C, T, H, W)`` (torch, numpy or JAX) to ``(B, 3, F, 8H, 8W)``."""
        if hasattr(z, "detach"):  # a torch tensor; numpy has no bfloat16, so go through fp32
            z = z.detach().cpu().float().numpy()
        z = jnp.asarray(z, self.dtype)
        sharding = self._latent_sharding(z.shape)
        if sharding is not None:
            z = jax.device_put(z, sharding)
        return self._jitted(self.state, z)


def from_upstream(
    upstream: Any,
    *,
    dtype: Any = "float32",
    param_dtype: Any = None,
    mesh: Mesh | None = None,
) -> FlaxVAE:
    """Builds the Flax decoder of a diffusers `AutoencoderKLCogVideoX` and loads its weights.

    The module is built abstractly (`nnx.eval_shape`: no random init), then
    filled from ``upstream.state_dict()`` through `convert_state_dict`, which
    checks the key sets and every shape and names any key that does not fit.

    Args:
        upstream: the diffusers module (any device, any dtype).
        dtype: compute dtype, ``"float32"`` or ``"bfloat16"``.
        param_dtype: weight dtype; defaults to ``dtype``.
        mesh: optional ``("dp", "tp")`` `jax.sharding.Mesh`; weights are
            replicated on it, activations split batch over dp, width over tp.

    Returns:
        A `FlaxVAE`.
    """
    config = dict(upstream.config)
    abstract = nnx.eval_shape(
        lambda: FlaxCogVideoXDecoder(config, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rngs=nnx.Rngs(0))
    )
    graphdef, abstract_state = nnx.split(abstract)
    state = convert_state_dict(upstream.state_dict(), abstract_state)
    return FlaxVAE(nnx.merge(graphdef, state), mesh)
