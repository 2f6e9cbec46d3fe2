"""`TorchaxVAE`: the patched upstream VAE, encoding and decoding as jits over a mesh.

A facade: the programs and weight copies are a `ProgramCache`'s, the memory
plans a `Planner`'s, upstream's calling conventions `UpstreamSurface`'s (its
attributes `attributes`'), a call's slicing and placement `calls`', the
folder format `saving`'s.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
import torch
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput

# diffusers' pipeline loader looks the base class up by this name in the
# module a model_index.json names: folders saved before the VAE reported
# upstream's class name this module.
from diffusers.models.modeling_utils import ModelMixin
from jax.sharding import Mesh

from cogvideox_torchax.config import canonical_dtype
from cogvideox_torchax.families import Family
from cogvideox_torchax.memory import budget
from cogvideox_torchax.memory.planner import Planner
from cogvideox_torchax.options import RuntimeOptions
from cogvideox_torchax.parallel import sharding
from cogvideox_torchax.platforms.run_plan import RunPlan
from cogvideox_torchax.vae import as_upstream, calls, saving, stream
from cogvideox_torchax.vae.ahead_of_time import AheadOfTime
from cogvideox_torchax.vae.program_cache import ProgramCache, ProgramKey, to_host_torch, to_numpy
from cogvideox_torchax.vae.stream import VideoChunk
from cogvideox_torchax.vae.upstream_surface import (
    INFERENCE_SURFACE,
    UnsupportedAttributeError,
    UpstreamSurface,
    family_signature,
    refuse_other_module_attributes,
)

__all__ = ["INFERENCE_SURFACE", "TorchaxVAE", "UnsupportedAttributeError", "to_host_torch"]

@refuse_other_module_attributes
class TorchaxVAE(AheadOfTime, UpstreamSurface, ModelMixin):
    """An upstream VAE (CogVideoX's, Wan's or LTX-2's), patched, run by torchax under `jax.jit`.

    Build it with `cogvideox_torchax.from_pretrained` or `cogvideox_torchax.wrap`.
    Weights live on the mesh's devices as JAX arrays and are passed to the jitted
    encode and decode as arguments, so one compiled program serves any weights of
    the same config, and one program is compiled per input shape.

    It stands in for the upstream module wherever inference code uses one
    (e.g. ``pipe.vae`` of the families' diffusers pipelines): `decode`, `encode`,
    `forward` (also by calling it), `enable_tiling` / `disable_tiling`,
    `enable_slicing` / `disable_slicing`, `config`, `dtype`, `device`, `to`
    and `save_pretrained`. Upstream's other public attributes read as
    upstream's when their value is plain data (``vae.temperal_downsample``,
    the tile sizes), and its settings (tiling, slicing, frames per batch) may
    be written (`attributes`); anything else of upstream's (training, hooks,
    submodules) raises `UnsupportedAttributeError` instead of running eager
    torch.

    It is a diffusers `ModelMixin` (so a ``torch.nn.Module``) without torch
    parameters or submodules, so that pipelines treat it as a component:
    ``pipe.to(dtype)`` converts it (`to`) and ``pipe.save_pretrained`` saves
    it (`save_pretrained`) as upstream's: the saved pipeline loads with
    upstream's VAE, which `wrap` takes again.
    Module methods that would act on torch parameters (``state_dict``,
    hooks, ``parameters``...) are refused as upstream attributes are.

    Lowering, compiling, memory plans and the compiled programs kept are
    `AheadOfTime`'s methods.

    Threads: one VAE may be shared by several threads. `decode`, `encode`,
    their ``_jax`` forms, `decode_frames_jax`, `memory_plan`, ``compile_*``,
    ``lower_*``, `to` and the tiling and slicing switches may be called at
    once. A shape is planned and compiled once, by the first thread that
    needs it, while the others wait for it; shapes already compiled run
    concurrently. Results equal single-threaded ones. A call that fails (a
    compile error, out of memory, an interrupt) leaves nothing half-built:
    the next call of that shape builds it anew. A decode or encode that
    overlaps ``to(dtype)`` runs wholly in the dtype it started with (with
    `enable_tiling` meanwhile, each element of a sliced batch may see
    either setting). Tracing holds one process-wide lock, so the VAEs of
    one process compile one at a time (and still run at once).

    Processes: nothing of a VAE is shared between processes; build one in
    each. They may share JAX's persistent compilation cache
    (`cogvideox_torchax.vae.compile_cache`) and a saved model folder.
    Under jax.distributed every process makes the same calls in the same
    order (they are collectives): drive the VAE from one thread per process.

    Attributes:
        programs: the `ProgramCache` (programs by target, tiling and mesh).
        planner: the `Planner` (each shape's `MemoryPlan`).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        state_dict: Mapping[str, torch.Tensor],
        options: RuntimeOptions,
        mesh: Mesh,
        max_memory: str | int | None = "auto",
    ):
        """Takes ownership of ``module`` (patched in place) and ``state_dict``.

        ``module`` may live on the meta device: only its structure is used.
        Prefer `from_pretrained` or `wrap`, which check the state dict first.
        ``max_memory`` is as `memory_plan` takes it.
        """
        max_memory = budget.parse_memory(max_memory)  # refused before anything is built
        ModelMixin.__init__(self)
        self.programs = ProgramCache(module, state_dict, options, mesh)
        self.planner = Planner(self.programs, max_memory)
        # With `__class__` below: the library diffusers records for the component.
        self.__dict__["__module__"] = self.family.upstream.__module__

    # diffusers names a pipeline's component in model_index.json after its
    # ``__class__`` and ``__module__`` (and saves it by the base class that one has): as
    # upstream's, a saved pipeline names upstream's VAE and loads anywhere
    # diffusers does, with or without this package, and `wrap` takes that VAE
    # again. ``type(vae)`` stays ours; ``isinstance(vae,
    # AutoencoderKLCogVideoX)`` (or ``AutoencoderKLWan``) holds, as for the
    # stand-in it is (the way `unittest.mock`'s specced mocks pass ``isinstance``).
    @property
    def __class__(self) -> type:
        return self.family.upstream

    @property
    def family(self) -> Family:
        """The model family (`cogvideox_torchax.families`): its frame rules, latent normalisation, presets."""
        return self.programs.family

    def __dir__(self) -> list[str]:
        # torch's and object's __dir__ read ``__class__``: list our own API.
        return sorted(set(dir(type(self))) | set(self.__dict__))

    # -- what runs ----------------------------------------------------------

    @property
    def plan(self) -> RunPlan:
        """What runs on the mesh's platform: patches, convolution layout and policy (`platforms.run_plan.RunPlan`)."""
        return self.programs.own.plan

    def plan_for(self, platform: str) -> RunPlan:
        """What would run if this VAE's program were built for ``platform`` (``"cpu"``, ``"cuda"``, ``"tpu"``)."""
        return self.programs.program(self.programs.platform_key(platform)).plan

    @property
    def platform(self) -> str:
        """The platform the mesh's devices are (``"cpu"``, ``"cuda"``, ``"rocm"`` or ``"tpu"``)."""
        return self.plan.placement.platform

    @property
    def compiler_options(self) -> dict[str, Any] | None:
        """XLA options `compile_decode` and `compile_encode` pass; use them to compile a `lower_*` result yourself."""
        return self.programs.compiler_options(ProgramKey())

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the weights, of decoded samples and of encoder moments."""
        return self.options.torch_dtype

    @property
    def options(self) -> RuntimeOptions:
        return self.programs.options

    def _set_dtype(self, dtype: str | torch.dtype) -> None:
        # `to`'s dtype change: the weights converted once, every plan and
        # program dropped (each depends on the dtype).
        # Under the lock every cache of this VAE shares: no plan, compile or
        # other `to` is half-way meanwhile.
        with self.programs.lock:
            options = dataclasses.replace(self.options, dtype=canonical_dtype(dtype))
            if options == self.options:
                return
            planner = Planner(self.programs.converted(options), self.planner.max_memory)
            # A call reads ``planner`` once and uses its ``programs``: it sees either dtype, whole.
            self.programs, self.planner = planner.programs, planner

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        subfolder: str | None = None,
        torch_dtype: torch.dtype | None = None,
        variant: str | None = None,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> TorchaxVAE:
        """Loads a VAE folder as diffusers' pipeline loader calls it (a saved pipeline naming this class).

        ``torch_dtype`` (or ``dtype``, its newer name) None keeps the dtype
        the weights were saved in.
        Prefer `cogvideox_torchax.from_pretrained`, which also takes a mesh
        and options.

        Raises:
            NotImplementedError: diffusers' device maps, offloading,
                quantization or non-safetensors loading.
        """
        if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
            raise ValueError(f"dtype={dtype} and torch_dtype={torch_dtype} disagree")
        module, state_dict, chosen = saving.read_saved(
            pretrained_model_name_or_path, subfolder, variant, dtype if dtype is not None else torch_dtype, kwargs
        )
        return cls(module, state_dict, RuntimeOptions(dtype=chosen), sharding.make_mesh(None))

    @property
    def mesh(self) -> Mesh:
        return self.programs.mesh

    @property
    def module(self) -> torch.nn.Module:
        """The patched upstream module of the mesh's platform (structure only; weights are `weights`)."""
        return self.programs.own.module

    @property
    def weights(self) -> dict[str, jax.Array]:
        """The state dict as JAX arrays on the mesh, in `dtype`."""
        return self.programs.weights

    # -- running ------------------------------------------------------------

    def check_latents(self, shape: tuple[int, ...]) -> None:
        """Raises ValueError unless ``shape`` is a decodable (B, C, T, H, W)."""
        calls.check_5d(shape, "latents", "(B, C, T, H, W)", self.family.latent_channels(self.config))

    def check_video(self, shape: tuple[int, ...]) -> None:
        """Raises ValueError unless ``shape`` is an encodable (B, C, F, H, W) video.

        Any frame count and size are accepted, as upstream accepts them
        (sizes that the family's patches split must divide); the family's
        counts (CogVideoX ``8 k + 1``, Wan ``4 k + 1``) and sizes divisible
        by its spatial compression decode back to the same frame count and
        size.
        """
        calls.check_5d(shape, "video", "(B, C, F, H, W)", self.family.video_channels(self.config))

    def prepare(self, kind: str, x: torch.Tensor | np.ndarray | jax.Array,
                inputs: tuple[np.ndarray, ...] = ()) -> tuple[jax.stages.Compiled, tuple]:
        """The planned executable of ``kind`` for ``x`` and its arguments (the weights, ``x`` and ``inputs`` placed).

        ``kind``: ``"decode"``, ``"frames"`` (`decode_frames_jax`) or ``"encode"``;
        ``inputs``: the family's decode inputs (`families.Family.decode_input_values`).
        Every decode and encode runs what this returns. A shape already
        compiled is found without waiting for another thread's compile; the
        executable runs outside any lock.
        """
        return calls.prepare(self, kind, x, inputs)

    def decode_jax(self, z: torch.Tensor | np.ndarray | jax.Array, **inputs: Any) -> jax.Array:
        """Decodes latents ``(B, C, T, H, W)`` (divided by the scaling factor, as upstream takes them) on device.

        Returns the video ``(B, 3, F, 8H, 8W)`` (Wan 2.2 TI2V-5B: ``16H, 16W``)
        in `dtype` as a JAX array, clamped or not as upstream (CogVideoX's
        unclamped, Wan's in [-1, 1]); ``F`` is the family's
        (`families.Family.frames_of`): CogVideoX 1 for ``T = 1``, ``4 T`` for
        even ``T`` and ``4 T - 3`` for odd ``T > 1`` (13 latent frames give
        49); Wan ``4 T - 3`` (21 give 81); LTX-2 ``8 T - 7``. ``inputs``: what
        upstream's decode takes besides the latents, by its names (LTX-2's
        ``temb``, the decode timestep of a timestep-conditioned decoder: one
        or one per video, 0 when left out, as ``LTX2Pipeline`` passes it).
        """
        self.check_latents(tuple(z.shape))
        as_upstream.check(self, "decode", z, inputs)
        return calls.run(self, "decode", z, calls.decode_inputs(self, z.shape[0], inputs))

    def decode_frames_jax(self, z: torch.Tensor | np.ndarray | jax.Array, **inputs: Any) -> tuple[jax.Array, jax.Array]:
        """Decodes straight to uint8 frames ``(B, F, 8H, 8W, 3)`` on device, and per video whether it was finite.

        The [-1, 1] -> uint8 mapping of diffusers' video processor runs in the
        jitted program, so what leaves the device is a quarter (fp32) or half
        (bf16) of the decoder's output. A video whose decoder output held NaN
        or Inf (``finite`` False) has garbage frames. ``inputs`` as `decode_jax`.
        """
        self.check_latents(tuple(z.shape))
        as_upstream.check(self, "decode", z, inputs)
        return calls.run(self, "frames", z, calls.decode_inputs(self, z.shape[0], inputs))

    def decode_stream(
        self, z: torch.Tensor | np.ndarray | jax.Array, *, output: str = "frames", in_flight: int = 2, **inputs: Any
    ) -> Iterator[VideoChunk]:
        """Decodes latents ``(B, C, T, H, W)`` one latent frame batch at a time, yielding each batch's frames in order.

        Each batch's result is copied to the host while the next batch
        decodes; joined, the chunks equal `decode_frames_jax` (``output=
        "frames"``: uint8 ``(B, F, H, W, 3)``) or `decode_jax` (``"video"``).
        Two programs serve every length (the first batch, and any later
        one), so device memory does not grow with the video: it holds the
        weights, the conv cache and at most ``in_flight`` batch outputs.

        Raises:
            ValueError: a bad shape, ``output`` or ``in_flight``, or tiling
                that applies to this frame size (tiled decodes do not stream;
                the message says why).
        """
        self.check_latents(tuple(z.shape))
        as_upstream.check(self, "decode", z, inputs)
        values = calls.decode_inputs(self, z.shape[0], inputs)
        programs = calls.planner_of(self).programs
        arr = np.asarray(to_numpy(z, np.dtype(programs.options.jax_dtype)))
        return stream.stream(programs, self.module, arr, output=output, in_flight=in_flight, inputs=values)

    @family_signature
    def decode(self, z: torch.Tensor | np.ndarray | jax.Array, *args: Any, **kwargs: Any
               ) -> DecoderOutput | tuple[torch.Tensor]:
        """Drop-in for upstream ``vae.decode(z, ...)``: the video as a torch tensor in `dtype`.

        Takes upstream's arguments (its family's: LTX-2's ``temb`` and
        ``causal`` besides ``return_dict``). Equal to upstream's
        ``vae.decode(z).sample``, on ``z``'s device for a torch ``z`` (else on
        `device`, the CPU by default); ``return_dict`` as upstream (a
        `DecoderOutput` or a 1-tuple).
        """
        arguments = calls.bind(self, "decode", (z, *args), kwargs)
        return_dict = arguments.pop("return_dict")
        del arguments["z"]
        video = self.decode_jax(z, **arguments)
        sample = to_host_torch(video).to(z.device if isinstance(z, torch.Tensor) else self.device)
        return DecoderOutput(sample=sample) if return_dict else (sample,)

    def encode_jax(self, x: torch.Tensor | np.ndarray | jax.Array) -> jax.Array:
        """Encodes a video ``(B, 3, F, H, W)`` in [-1, 1] on device; returns the moments as a JAX array.

        ``(B, 2 C, T, H', W')`` in `dtype`: the posterior's mean then its
        (unclamped) log-variance along dim 1, as upstream's ``_encode``
        returns them. With slicing enabled, one batch element at a time.
        """
        self.check_video(tuple(x.shape))
        as_upstream.check(self, "encode", x)
        return calls.run(self, "encode", x)

    @family_signature
    def encode(self, x: torch.Tensor | np.ndarray | jax.Array, *args: Any, **kwargs: Any
               ) -> AutoencoderKLOutput | tuple[DiagonalGaussianDistribution]:
        """Drop-in for upstream ``vae.encode(x, ...)`` of a video ``(B, 3, F, H, W)`` in [-1, 1].

        Takes upstream's arguments (LTX-2's ``causal`` besides ``return_dict``).

        Returns upstream's own `DiagonalGaussianDistribution` (as
        ``.latent_dist``) over the moments, built on the host in torch on
        ``x``'s device (else on `device`): ``.mode()``, ``.mean``, ``.logvar``,
        ``.std`` and ``.sample(generator=...)`` behave exactly as upstream's.
        """
        return_dict = calls.bind(self, "encode", (x, *args), kwargs)["return_dict"]
        posterior = self.latent_dist(self.encode_jax(x), device=x.device if isinstance(x, torch.Tensor) else None)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    def latent_dist(self, moments: jax.Array, device: torch.device | str | None = None) -> DiagonalGaussianDistribution:
        """Upstream's `DiagonalGaussianDistribution` over `encode_jax`'s moments, on ``device`` (default `device`).

        Under jax.distributed every process must call it (the moments are
        gathered from every process).
        """
        return DiagonalGaussianDistribution(to_host_torch(moments).to(self.device if device is None else device))

    def __repr__(self) -> str:
        mesh = ",".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        return (
            f"TorchaxVAE({self.family.class_name}, dtype={self.options.dtype}, mesh={mesh}, "
            f"latent_channels={self.family.latent_channels(self.config)}, plan={self.plan})"
        )
