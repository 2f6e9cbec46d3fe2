"""`TorchaxVAE`: the patched upstream VAE, decoding as one jit over a mesh."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.autoencoders.vae import DecoderOutput
from jax.sharding import Mesh

from cogvideox_torchax import frame_scan, patches, sharding, tiling
from cogvideox_torchax._torch_compat import import_torchax
from cogvideox_torchax.config import RuntimeOptions

torchax = import_torchax()
from torchax import interop  # noqa: E402

# torchax computes some index arithmetic in int64; with x64 off JAX narrows it
# to int32 (harmless at these sizes) and warns on every trace.
_INT64_WARNING = "Explicitly requested dtype int64"


def _to_host_torch(x: jax.Array) -> torch.Tensor:
    arr = np.array(x)  # gathers every shard; a writable copy
    if arr.dtype == np.dtype(jax.numpy.bfloat16):
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _to_numpy(x: torch.Tensor | np.ndarray | jax.Array, np_dtype: Any) -> np.ndarray | jax.Array:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    if isinstance(x, jax.Array):
        return x.astype(np_dtype)
    return np.asarray(x).astype(np_dtype, copy=False)


class TorchaxVAE:
    """Upstream `AutoencoderKLCogVideoX`, patched, run by torchax under `jax.jit`.

    Build it with `cogvideox_torchax.from_pretrained` or `cogvideox_torchax.wrap`.
    Weights live on the mesh's devices as JAX arrays and are passed to the jitted
    decode as arguments, so one compiled program serves any weights of the same
    config, and one program is compiled per input shape.
    """

    def __init__(
        self,
        module: AutoencoderKLCogVideoX,
        state_dict: Mapping[str, torch.Tensor],
        options: RuntimeOptions,
        mesh: Mesh,
    ):
        """Takes ownership of ``module`` (patched in place) and ``state_dict``.

        ``module`` may live on the meta device: only its structure is used.
        Prefer `from_pretrained` or `wrap`, which check the state dict first.
        """
        self._options = options
        self._mesh = mesh
        module.eval()
        if options.chunk_free_conv:
            patches.apply_safe_conv(module)
        if options.group_norm:
            patches.apply_group_norm(module)
        if options.silu:
            patches.apply_silu(module)
        if options.conv_bias:
            patches.apply_conv_bias(module)
        if options.trim_conv_cache:
            patches.apply_conv_cache_trim(module)
        if options.cache_first:
            patches.apply_cache_first(module)
        if options.frame_scan:
            frame_scan.apply_frame_scan(module)
        if options.tile_batching:
            tiling.apply_tile_batching(module, tiles_per_step=mesh.shape["dp"])
        patches.apply_width_sharding(module, mesh if options.shard_activations else None)
        self._module = module
        self._jittable = interop.JittableModule(module)

        np_dtype = np.dtype(options.jax_dtype)
        weights_sharding = sharding.replicated(mesh)
        self._weights = {
            name: jax.device_put(_to_numpy(t, np_dtype), weights_sharding) for name, t in state_dict.items()
        }
        self._jit_decode = jax.jit(self._decode_pure)
        # One executable per latent shape, compiled ahead of time so callers
        # can time compilation apart from decoding.
        self._executables: dict[tuple[int, ...], jax.stages.Compiled] = {}

    # -- the traced program -------------------------------------------------

    def _decode_pure(self, weights: dict[str, jax.Array], z: jax.Array) -> jax.Array:
        env = torchax.default_env()
        nearest = patches.nearest_interpolation(env) if self._options.nearest_upsample else contextlib.nullcontext()
        with env, torch.no_grad(), nearest:
            weights_t, z_t = env.j2t_iso((weights, z))
            (sample,) = self._jittable.functional_call("decode", weights_t, {}, z_t, return_dict=False)
        return env.t2j_iso(sample)

    # -- public surface -----------------------------------------------------

    @property
    def config(self) -> Any:
        """The upstream diffusers config (a read-only mapping with attributes)."""
        return self._module.config

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the weights and of decoded samples."""
        return self._options.torch_dtype

    @property
    def options(self) -> RuntimeOptions:
        return self._options

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def module(self) -> AutoencoderKLCogVideoX:
        """The patched upstream module (structure only; weights are `weights`)."""
        return self._module

    @property
    def weights(self) -> dict[str, jax.Array]:
        """The state dict as JAX arrays on the mesh, in `dtype`."""
        return self._weights

    def check_latents(self, shape: tuple[int, ...]) -> None:
        """Raises ValueError unless ``shape`` is a decodable (B, C, T, H, W)."""
        channels = self.config.latent_channels
        if len(shape) != 5:
            raise ValueError(f"latents must be (B, C, T, H, W), got shape {tuple(shape)}")
        if shape[1] != channels:
            raise ValueError(f"latents must have {channels} channels (dim 1), got shape {tuple(shape)}")
        if min(shape) < 1:
            raise ValueError(f"latents have an empty dimension: shape {tuple(shape)}")

    def _device_latents(self, z: torch.Tensor | np.ndarray | jax.Array) -> jax.Array:
        self.check_latents(tuple(z.shape))
        arr = _to_numpy(z, np.dtype(self._options.jax_dtype))
        return jax.device_put(arr, sharding.input_sharding(arr.shape, self._mesh))

    def decode_jax(self, z: torch.Tensor | np.ndarray | jax.Array) -> jax.Array:
        """Decodes on device and returns the JAX array (no host copy).

        Args:
            z: latents ``(B, C, T, H, W)``, already divided by the scaling factor
                as for upstream `decode`.

        Returns:
            Video ``(B, 3, F, 8H, 8W)`` in `dtype`, unclamped as upstream
            (the video processor clamps to [-1, 1] later); ``F`` is 1 for
            ``T = 1``, ``4 T`` for even ``T`` and ``4 T - 3`` for odd ``T > 1``
            (13 latent frames give 49).
        """
        zj = self._device_latents(z)
        return self.compile_decode(zj.shape)(self._weights, zj)

    def decode(
        self, z: torch.Tensor | np.ndarray | jax.Array, return_dict: bool = True
    ) -> DecoderOutput | tuple[torch.Tensor]:
        """Drop-in for upstream ``vae.decode(z)``.

        Args:
            z: latents ``(B, C, T, H, W)`` as upstream takes them.
            return_dict: as upstream: a `DecoderOutput` or a 1-tuple.

        Returns:
            The decoded video as a CPU torch tensor in `dtype`, equal to
            upstream's ``vae.decode(z).sample``.
        """
        sample = _to_host_torch(self.decode_jax(z))
        if not return_dict:
            return (sample,)
        return DecoderOutput(sample=sample)

    def lower_decode(self, shape: tuple[int, ...]) -> jax.stages.Lowered:
        """Traces and lowers the decode for a latent shape without running it.

        ``lower_decode(shape).compile().memory_analysis()`` gives the compiled
        program's per-device temporary and argument bytes.
        """
        shape = tuple(shape)
        self.check_latents(shape)
        spec = jax.ShapeDtypeStruct(shape, self._options.jax_dtype, sharding=sharding.input_sharding(shape, self._mesh))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_INT64_WARNING)
            return self._jit_decode.lower(self._weights, spec)

    def compile_decode(self, shape: tuple[int, ...]) -> jax.stages.Compiled:
        """The compiled decode for a latent shape, compiling it on first use."""
        shape = tuple(shape)
        if shape not in self._executables:
            self._executables[shape] = self.lower_decode(shape).compile(compiler_options=self.compiler_options)
        return self._executables[shape]

    @property
    def compiler_options(self) -> dict[str, str] | None:
        """XLA options `compile_decode` passes; use them to compile a `lower_decode` result yourself.

        On the CPU backend this keeps the optimization barriers of
        `patches.CacheFirstCausalConv3d`, which XLA:CPU otherwise deletes.
        """
        if self._options.cache_first and self._mesh.devices.flat[0].platform == "cpu":
            return dict(patches.KEEP_BARRIERS_COMPILER_OPTIONS)
        return None

    def enable_tiling(self, **kwargs: Any) -> None:
        """Upstream's ``enable_tiling`` (same keywords and defaults: 240x360 tiles, overlap 1/6 x 1/5).

        Latents larger than one tile then decode tile by tile with upstream's
        grid and blending; equal-shape tiles are decoded together (see
        `cogvideox_torchax.tiling`). Compiled programs are dropped.
        """
        self._module.enable_tiling(**kwargs)
        self._retrace()

    def disable_tiling(self) -> None:
        """Upstream's ``disable_tiling``; compiled programs are dropped."""
        self._module.disable_tiling()
        self._retrace()

    @property
    def use_tiling(self) -> bool:
        return bool(self._module.use_tiling)

    def _retrace(self) -> None:
        # The module's tiling settings are read while tracing, and jax.jit
        # keys its trace cache on argument shapes only: start a fresh jit.
        self._jit_decode = jax.jit(self._decode_pure)
        self._executables.clear()

    def clear_compiled(self, *, jax_caches: bool = False) -> None:
        """Drops this VAE's compiled programs (one is kept per latent shape).

        Decoding many different shapes in one long process keeps one
        executable each, in host memory, until this is called. Device memory
        does not grow with repeated decodes of a shape (each call's
        temporaries are freed when it returns); the weights stay until the
        VAE itself is dropped.

        Args:
            jax_caches: also call `jax.clear_caches()`, which empties JAX's
                process-wide tracing and compilation caches (every jitted
                function in the process recompiles on its next call). Needed
                only to release what other jitted code compiled, e.g. after
                deleting a VAE built with different options.
        """
        self._executables.clear()
        if jax_caches:
            jax.clear_caches()

    def __repr__(self) -> str:
        mesh = ",".join(f"{k}={v}" for k, v in self._mesh.shape.items())
        return f"TorchaxVAE(dtype={self._options.dtype}, mesh={mesh}, latent_channels={self.config.latent_channels})"
