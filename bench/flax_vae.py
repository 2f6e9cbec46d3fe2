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
The torch -> NNX key map lives in `bench.flax_weights`, the layers in
`bench.flax_layers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bench.flax_layers import (
    ACTIVATION_SPEC,
    Cache,
    CausalConv3d,
    LayerOptions,
    MidBlock3D,
    SpatialNorm3D,
    UpBlock3D,
    jax_dtype,
)
from bench.flax_weights import convert_state_dict


class Decoder3D(nnx.Module):
    """`CogVideoXDecoder3D`: one frame batch of latents to frames, threading the conv cache."""

    def __init__(self, config: Mapping[str, Any], opts: LayerOptions, *, rngs: nnx.Rngs):
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
        dtype = jax_dtype(dtype)
        param_dtype = dtype if param_dtype is None else jax_dtype(param_dtype)
        opts = LayerOptions(dtype, param_dtype, activation_sharding(mesh))
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

    def __init__(self, model: FlaxCogVideoXDecoder, mesh: Mesh | None = None, *, place: bool = True):
        self.mesh = _auto_mesh(mesh)
        self.dtype = model.opts.dtype
        self.graphdef, state = nnx.split(model)
        if self.mesh is not None and place:
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


def abstract(config: Mapping[str, Any], *, dtype: Any = "bfloat16", mesh: Mesh) -> FlaxVAE:
    """A `FlaxVAE` without weights, for lowering on ``mesh`` (e.g. an accelerator's compile-only devices).

    Its ``state`` holds `jax.ShapeDtypeStruct`s replicated on the mesh, so
    `FlaxVAE.lower` traces exactly the program `from_upstream` would run,
    and nothing is placed on a device.
    """
    model = nnx.eval_shape(lambda: FlaxCogVideoXDecoder(dict(config), dtype=dtype, mesh=mesh, rngs=nnx.Rngs(0)))
    port = FlaxVAE(model, mesh, place=False)
    replicated = NamedSharding(port.mesh, PartitionSpec())
    port.state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), port.state)
    return port


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
