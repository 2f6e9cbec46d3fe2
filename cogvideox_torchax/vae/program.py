"""One target's program: the patched upstream module and its jitted decode, frames and encode.

`TorchaxVAE` keeps one `Program` per target platform and tiling; each
compiles once per input shape (`executables`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import torch
from jax.sharding import Mesh

from cogvideox_torchax import families
from cogvideox_torchax._torch_compat import import_torchax
from cogvideox_torchax.parallel import sharding
from cogvideox_torchax.patches import registry
from cogvideox_torchax.platforms.build import apply_plan
from cogvideox_torchax.platforms.run_plan import RunPlan
from cogvideox_torchax.vae import drawn_noise
from cogvideox_torchax.vae.weight_layout import WeightLayout

torchax = import_torchax()
from torchax import interop  # noqa: E402


def is_setting(name: str) -> bool:
    """Whether ``name`` is one of upstream's settings: tiling, slicing and frames per batch, read while tracing.

    ``use_tiling``, ``use_slicing``, ``tile_*`` (sizes, strides, overlaps),
    ``use_framewise_*`` and ``num_*_batch_size`` (CogVideoX's latent and
    sample frames per batch): what ``enable_tiling`` and ``enable_slicing``
    set, or a user by hand, and what upstream's decode and encode read.
    """
    return (name in ("use_tiling", "use_slicing") or name.startswith(("tile_", "use_framewise_"))
            or (name.startswith("num_") and name.endswith("_batch_size")))


def tiling_switches(module: torch.nn.Module) -> dict[str, Any]:
    """The settings (`is_setting`) ``module`` holds, as upstream's module attributes."""
    return {k: v for k, v in vars(module).items() if is_setting(k)}


class Program:
    """One target's patched module and its jitted encode and decode, compiled once per input shape."""

    # The upstream method each program kind calls, and its extra arguments.
    _METHODS = {
        "decode": ("decode", {"return_dict": False}),
        "frames": ("decode", {"return_dict": False}),
        "encode": ("_encode", {}),
    }

    def __init__(self, module: torch.nn.Module, plan: RunPlan, mesh: Mesh):
        apply_plan(module, plan, mesh)
        self.module = module
        self.plan = plan
        self.mesh = mesh
        self.family = families.of_module(module)
        # The weights' layout each kind's jits take (`ProgramCache.weights_for` gives them so).
        self._layouts = {side: WeightLayout.of(module, plan, side) for side in ("decode", "encode")}
        self._jittable = interop.JittableModule(module)
        self.jits = {kind: jax.jit(self._traced(kind)) for kind in self._METHODS}
        # The decode one latent frame batch at a time (`cogvideox_torchax.vae.stream`):
        # (first batch?, "frames" or "video", cache out?) -> (weights, z, conv cache, decode inputs)
        # -> (output, conv cache).
        # A video of one batch returns no cache: the whole decode of it computes none, and a cache
        # kept live changes how XLA fuses the layers before it (1 float32 ulp apart on XLA:CPU).
        self.stream_jits = {
            (first, output, cache_out): jax.jit(self._batch(first, output, cache_out))
            for first in (True, False)
            for output in ("frames", "video")
            for cache_out in (True, False)
            if cache_out or first
        }
        self.executables: dict[tuple[str, tuple[int, ...]], jax.stages.Compiled] = {}

    def layout(self, kind: str) -> WeightLayout:
        """The layout of the weights the jits of ``kind`` (a `Program` kind or a stream's) take."""
        return self._layouts["encode" if kind == "encode" else "decode"]

    def _traced(self, kind: str):
        method, kwargs = self._METHODS[kind]

        def run(weights: dict[str, jax.Array], x: jax.Array, *inputs: jax.Array) -> jax.Array:
            # ``inputs``: the family's decode inputs after the latents (`Family.decode_inputs`), none for most,
            # then the noise upstream's decode draws (`drawn_noise`), none for most.
            env = registry.environment(self.plan.steps)
            with env, torch.no_grad():
                weights_t, x_t, inputs_t = env.j2t_iso((self.layout(kind).to_upstream(weights), x, inputs))
                inputs_t, noise_t = self._split(inputs_t)
                with self._noise(kind, noise_t):
                    out = self._jittable.functional_call(method, weights_t, {}, x_t, *inputs_t, **kwargs)
            out = self._whole_width_if_uneven(env.t2j_iso(out[0] if isinstance(out, tuple) else out))
            return to_frames(out) if kind == "frames" else out

        return run

    def _whole_width_if_uneven(self, out: jax.Array) -> jax.Array:
        """A ``(B, C, T, H, W)`` result whose width ``tp`` does not divide, constrained whole in width.

        Left free, XLA may give it a tiling over part of ``tp`` (width 20 over
        8 devices: 4 tiles, each on 2) that jax 0.12 cannot express on the
        mesh when it compiles the program (``IndivisibleError``). Widths that
        divide are left as they were: their programs do not change.
        """
        tp = self.mesh.shape["tp"]
        if self.mesh.size == 1 or out.shape[-1] % tp == 0:
            return out
        return jax.lax.with_sharding_constraint(out, sharding.input_sharding(out.shape, self.mesh))

    def _split(self, inputs: tuple) -> tuple[tuple, tuple]:
        # The decode inputs (one value per video), then the noise draws.
        count = len(self.family.decode_inputs(self.module.config))
        return tuple(inputs[:count]), tuple(inputs[count:])

    def _noise(self, kind: str, draws: tuple) -> contextlib.AbstractContextManager:
        # Upstream's torch.randn calls answered by the draws, where its decode draws any.
        if kind == "encode" or not self.family.draws_noise(self.module.config):
            return contextlib.nullcontext()
        return drawn_noise.supplying(draws)

    def _batch(self, first: bool, output: str, cache_out: bool = True):
        def decode_batch(module: torch.nn.Module, z: torch.Tensor, cache: Any, inputs: tuple) -> Any:
            # One iteration of upstream's decode loop, as its family runs it.
            return self.family.decode_batch(module, z, cache, first, *inputs)

        def run(weights: dict[str, jax.Array], z: jax.Array, cache: Any = None, inputs: tuple = ()) -> Any:
            env = registry.environment(self.plan.steps)
            with env, torch.no_grad():
                weights_t, z_t, cache_t, inputs_t = env.j2t_iso((self.layout("decode").to_upstream(weights), z, cache,
                                                                   inputs))
                cache_t = None if first else cache_t
                inputs_t, noise_t = self._split(inputs_t)
                with self._noise("decode", noise_t):
                    out, new_cache = self._jittable.functional_call(decode_batch, weights_t, {}, z_t, cache_t,
                                                                    inputs_t)
            out, new_cache = env.t2j_iso((out, new_cache if cache_out else None))
            out = self._whole_width_if_uneven(out)
            if output == "frames":
                return to_frames(out), new_cache
            return (out, jax.numpy.isfinite(out).all(axis=(1, 2, 3, 4))), new_cache

        return run


def to_frames(video: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Decoder output ``(B, 3, F, H, W)`` -> uint8 frames ``(B, F, H, W, 3)`` and, per video, whether it was finite.

    The mapping of diffusers' video processor, in fp32 as
    `cogvideox_torchax.io.video.to_uint8` does it on the host:
    ``round(clip(x / 2 + 0.5, 0, 1) * 255)``, halves to even.
    """
    x = video.astype(jax.numpy.float32)
    finite = jax.numpy.isfinite(x).all(axis=(1, 2, 3, 4))
    frames = jax.numpy.round(jax.numpy.clip(x * 0.5 + 0.5, 0.0, 1.0) * 255).astype(jax.numpy.uint8)
    return frames.transpose(0, 2, 3, 4, 1), finite
