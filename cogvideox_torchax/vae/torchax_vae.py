"""`TorchaxVAE`: the user's object, an upstream VAE patched and run as jits over a mesh.

It is upstream's surface (``decode``, ``encode``, ``forward``, the tiling and
slicing switches, ``to``, ``save_pretrained``) plus the JAX forms, plans and
stream; each method is thin and calls the module that does the work: a
`ProgramCache` (programs, weights), a `Planner` (memory plans), `calls`
(one decode or encode), `ahead_of_time` (lowering and compiling before
running), `stream` (the streamed decode), `attributes` (upstream's other
attributes), `saving` (upstream's folder format).
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
from cogvideox_torchax.vae import ahead_of_time, as_upstream, attributes, calls, saving, stream
from cogvideox_torchax.vae.attributes import (
    INFERENCE_SURFACE,
    UnsupportedAttributeError,
    refuse_other_module_attributes,
)
from cogvideox_torchax.vae.program_cache import ProgramCache, ProgramKey, to_host_torch, to_numpy
from cogvideox_torchax.vae.stream import VideoChunk
from cogvideox_torchax.vae.upstream_surface import family_signature

__all__ = ["INFERENCE_SURFACE", "TorchaxVAE", "UnsupportedAttributeError", "to_host_torch"]

@refuse_other_module_attributes
class TorchaxVAE(ModelMixin):
    """An upstream VAE (CogVideoX's, Wan's or LTX-2's), patched, run by torchax under `jax.jit`.

    Build it with `cogvideox_torchax.from_pretrained` or `cogvideox_torchax.wrap`.
    Weights live on the mesh's devices as JAX arrays and are passed to the jitted
    encode and decode as arguments, so one compiled program serves any weights of
    the same config, and one program is compiled per input shape. A CPU program
    takes its convolution weights transposed (`vae.weight_layout`): run a compiled
    executable with the arguments `prepare` gives, not with `weights`.

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

    Lowering, compiling, memory plans, the stream's plan and the compiled
    programs kept are its methods too (`ahead_of_time`, `Planner`, `stream`).

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

    # -- upstream's calling conventions ---------------------------------------

    # Where results of inputs that are not torch tensors go; `to` moves it.
    _result_device = torch.device("cpu")

    @property
    def config(self) -> Any:
        """The upstream diffusers config (a read-only mapping with attributes)."""
        return self.module.config

    @property
    def device(self) -> torch.device:
        """The torch device results land on when the input is not a torch tensor (CPU unless `to` moved it).

        Torch inputs get their results on their own device, whatever this says;
        the computation itself runs on the mesh's devices.
        """
        return self._result_device

    @property
    def use_tiling(self) -> bool:
        """Upstream's ``use_tiling``: whether `enable_tiling` is on."""
        return bool(self.module.use_tiling)

    @property
    def use_slicing(self) -> bool:
        """Upstream's ``use_slicing``: whether `enable_slicing` is on."""
        return bool(self.module.use_slicing)

    @family_signature
    def forward(self, sample: torch.Tensor, *args: Any, **kwargs: Any) -> DecoderOutput | tuple[torch.Tensor]:
        """Upstream's ``forward``: encode, take the posterior's mode (or a sample), decode.

        Takes upstream's arguments: ``sample`` (video ``(B, 3, F, H, W)`` in
        [-1, 1]), ``sample_posterior`` (decode ``latent_dist.sample(generator)``
        instead of ``latent_dist.mode()``), ``return_dict`` (a
        `DecoderOutput` or a 1-tuple), ``generator``, and its family's (LTX-2's
        ``temb`` for the decode).
        """
        arguments = calls.bind(self, "forward", (sample, *args), kwargs)
        posterior = self.encode(sample).latent_dist
        generator = arguments.get("generator")
        z = posterior.sample(generator=generator) if arguments.get("sample_posterior") else posterior.mode()
        inputs = {name: arguments[name] for name in self.family.decode_inputs(self.config) if name in arguments}
        return self.decode(z, return_dict=arguments["return_dict"], **inputs)

    __call__ = forward

    @family_signature
    def enable_tiling(self, *args: Any, **kwargs: Any) -> None:
        """Upstream's ``enable_tiling``, with its family's arguments and defaults.

        CogVideoX: ``tile_sample_min_height``, ``tile_sample_min_width``,
        ``tile_overlap_factor_height``, ``tile_overlap_factor_width`` (240x360
        tiles, overlap 1/6 x 1/5). Wan: ``tile_sample_min_height``,
        ``tile_sample_min_width``, ``tile_sample_stride_height``,
        ``tile_sample_stride_width`` (256x256 tiles, stride 192). Videos and
        latents larger than one tile then encode and decode tile by tile with
        upstream's grid and blending (CogVideoX's equal-shape tiles decoded
        together, `cogvideox_torchax.patches.tiling`). Compiled programs are
        dropped.
        """
        with self.programs.lock:  # the module's switches are read while another thread traces
            self.module.enable_tiling(*args, **kwargs)
            self.reset_programs()

    def disable_tiling(self) -> None:
        """Upstream's ``disable_tiling``; compiled programs are dropped."""
        with self.programs.lock:
            self.module.disable_tiling()
            self.reset_programs()

    def enable_slicing(self) -> None:
        """Upstream's ``enable_slicing``: a batch is encoded and decoded one element at a time.

        Results are unchanged; device memory is that of batch 1, and one
        program (for batch 1) serves every batch size.
        """
        with self.programs.lock:
            self.module.enable_slicing()

    def disable_slicing(self) -> None:
        """Upstream's ``disable_slicing``: whole batches again."""
        with self.programs.lock:
            self.module.disable_slicing()

    def to(self, *args: Any, **kwargs: Any) -> TorchaxVAE:
        """Upstream's ``.to(device)`` / ``.to(dtype)`` / ``.to(device, dtype)``, as pipelines call it; returns self.

        A dtype other than `dtype` converts the VAE: its weights once, and
        its plans and programs anew for that dtype (the next decode
        compiles). The computation stays on the mesh: a device becomes
        `device`, where results of non-torch inputs go.

        Raises:
            ValueError: a dtype this VAE cannot run (the message names those it can).
        """
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != self.dtype:
            try:
                self._set_dtype(dtype)
            except ValueError as e:
                raise ValueError(f"TorchaxVAE cannot run in {dtype}: {e}") from None
        if device is not None:
            self._result_device = torch.device(device)
        return self

    # torch.nn.Module's casts and moves, as `to` does them.

    def half(self) -> TorchaxVAE:
        """``to(torch.float16)``."""
        return self.to(torch.float16)

    def float(self) -> TorchaxVAE:
        """``to(torch.float32)``."""
        return self.to(torch.float32)

    def bfloat16(self) -> TorchaxVAE:
        """``to(torch.bfloat16)``."""
        return self.to(torch.bfloat16)

    def double(self) -> TorchaxVAE:
        """``to(torch.float64)``: refused, as the VAE runs float32, bfloat16 or float16 only."""
        return self.to(torch.float64)

    def type(self, dst_type: torch.dtype | str) -> TorchaxVAE:
        """``to(dst_type)`` for a torch dtype; a type name is refused."""
        if isinstance(dst_type, str):
            raise UnsupportedAttributeError("TorchaxVAE.type takes a torch dtype", name="type", obj=self)
        return self.to(dst_type)

    def cpu(self) -> TorchaxVAE:
        """``to("cpu")``: results of non-torch inputs land on the CPU."""
        return self.to("cpu")

    def cuda(self, device: int | torch.device | None = None) -> TorchaxVAE:
        """``to("cuda")`` (or that CUDA device): results of non-torch inputs land there."""
        return self.to(torch.device("cuda", device) if isinstance(device, int) else (device or "cuda"))

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        is_main_process: bool = True,
        safe_serialization: bool = True,
        variant: str | None = None,
        torch_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        """Upstream's ``save_pretrained``: ``config.json`` and the weights in upstream's format (`saving`).

        ``AutoencoderKLCogVideoX.from_pretrained`` and our ``from_pretrained``
        load the folder back. The weights are written in `dtype` unless
        ``torch_dtype`` says otherwise; ``variant`` names the file as
        upstream does.

        Raises:
            ValueError: ``safe_serialization=False`` (no pickles) or a file as ``save_directory``.
            NotImplementedError: upstream's hub, sharding and custom-save options.
        """
        unsupported = {k: v for k, v in kwargs.items() if k in ("push_to_hub", "save_function") and v}
        if unsupported:
            raise NotImplementedError(f"TorchaxVAE.save_pretrained does not take {', '.join(unsupported)}")
        saving.save_pretrained(self.config, self.weights, save_directory, upstream=self.family.upstream,
                               is_main_process=is_main_process, safe_serialization=safe_serialization,
                               variant=variant, torch_dtype=torch_dtype)

    # Training scripts put a VAE they only encode with in inference mode;
    # these say yes to that and refuse anything else.

    @property
    def training(self) -> bool:
        """Always False: this VAE only runs inference."""
        return False

    @training.setter
    def training(self, mode: bool) -> None:
        # torch.nn.Module.__init__ sets it (to True) before anything else;
        # later, only False is taken, as by `train`.
        if mode and "programs" in self.__dict__:
            self.train(True)

    def eval(self) -> TorchaxVAE:
        """Upstream's ``eval()``: a no-op here (always in inference mode); returns self."""
        return self

    def train(self, mode: bool = True) -> TorchaxVAE:
        """``train(False)`` is a no-op returning self, as ``eval()``.

        Raises:
            UnsupportedAttributeError: ``train(True)``: this VAE cannot be trained.
        """
        if mode:
            raise UnsupportedAttributeError(
                "TorchaxVAE runs inference only and cannot be put in training mode; train the upstream module",
                name="train",
                obj=self,
            )
        return self

    def requires_grad_(self, requires_grad: bool = True) -> TorchaxVAE:
        """``requires_grad_(False)`` is a no-op returning self (nothing here takes gradients).

        Raises:
            UnsupportedAttributeError: ``requires_grad_(True)``.
        """
        if requires_grad:
            raise UnsupportedAttributeError(
                "TorchaxVAE takes no gradients; requires_grad_(True) needs the upstream module",
                name="requires_grad_",
                obj=self,
            )
        return self

    def __getattr__(self, name: str) -> Any:
        """Only reached when ordinary lookup fails: upstream's plain data, else an error (`attributes.read`)."""
        # Upstream's other attributes are told apart from plain typos.
        return attributes.read(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Upstream's settings reach the patched module; its other attributes are refused.
        if not attributes.write(self, name, value):
            super().__setattr__(name, value)

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

    def stream_plan(self, shape: tuple[int, ...], *, output: str = "frames", in_flight: int = 2) -> budget.MemoryPlan:
        """The plan of `decode_stream` for latents of ``shape``: its two programs compiled, nothing run.

        ``bytes`` is the larger program's temporaries, arguments and outputs
        per device, plus ``in_flight`` batch outputs; it does not grow with
        the number of latent frames. ``budget`` is the VAE's (`memory_budget`,
        margin taken off), which the caller compares.

        Raises:
            ValueError: a shape or plan that does not stream (the message says why).
        """
        shape = tuple(shape)
        self.check_latents(shape)
        return stream.plan(self, shape, output, in_flight)

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

    # -- ahead of time: lowered, compiled or planned without running ----------

    def lower_decode(
        self, shape: tuple[int, ...], *, platform: str | None = None, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Lowered:
        """Traces and lowers the decode for latents ``(B, C, T, H, W)`` without running it.

        ``platform`` (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``) builds the
        program with that platform's plan (`plan_for`); only the mesh's own
        compiles here. ``target`` (`targets.TARGETS`: ``"h200"``, ``"v6e-8"``,
        ...) over ``mesh`` (``"dp=1,tp=8"``; default all on ``tp``) builds it
        on that accelerator's compile-only devices; it compiles here with its
        real compiler (the ``aot`` extra).
        """
        return ahead_of_time.lower(self, "decode", shape, platform, target, mesh)

    def lower_encode(
        self, shape: tuple[int, ...], *, platform: str | None = None, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Lowered:
        """Traces and lowers the encode for a video shape without running it (arguments as in `lower_decode`)."""
        return ahead_of_time.lower(self, "encode", shape, platform, target, mesh)

    def compile_decode(
        self, shape: tuple[int, ...], *, frames: bool = False, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Compiled:
        """The planned decode for a latent shape (of `decode_frames_jax` with ``frames``), compiled on first use.

        ``target`` and ``mesh`` compile the planned program for a named
        accelerator (see `lower_decode`); it cannot run here.
        """
        return self.planned_executable("frames" if frames else "decode", shape, target, mesh)

    def compile_encode(self, shape: tuple[int, ...], *, target: str | None = None, mesh: Any = None):
        """The planned encode for a video shape, compiled on first use (``target`` as in `compile_decode`)."""
        return self.planned_executable("encode", shape, target, mesh)

    def planned_executable(self, kind: str, shape, target: str | None = None, mesh: Any = None) -> jax.stages.Compiled:
        """The executable `memory_plan` chose for ``shape``, of ``kind`` (``"decode"``, ``"frames"``, ``"encode"``)."""
        return ahead_of_time.planned_executable(self, kind, shape, target, mesh)

    def memory_plan(
        self, shape: tuple[int, ...], *, kind: str = "decode", target: str | None = None, mesh: Any = None
    ) -> budget.MemoryPlan:
        """How a shape runs within the memory budget (`Planner.plan`), compiling candidates (running nothing).

        ``kind``: ``"decode"``, ``"frames"`` or ``"encode"``; ``target`` and
        ``mesh`` plan for a named accelerator (as `lower_decode` takes them).

        Raises:
            MemoryBudgetError: no candidate fits; says what each needs.
        """
        return self.planner.plan(kind, tuple(shape), target, mesh)

    def memory_candidates(self, shape: tuple[int, ...], *, kind: str = "decode") -> list[budget.MemoryPlan]:
        """Every candidate plan of `memory_plan` with its compiled bytes, in order (all compiled; none run)."""
        return ahead_of_time.memory_candidates(self, kind, shape)

    def planned(self, shape: tuple[int, ...], *, kind: str = "decode") -> budget.MemoryPlan | None:
        """The plan `memory_plan` chose for a shape, or None if it has not planned it (compiles nothing)."""
        return self.planner.planned(kind, tuple(shape))

    def memory_budget(self) -> tuple[int, str]:
        """The per-device bytes plans must fit (before `budget.SAFETY_MARGIN`) and their source (`Planner.budget`)."""
        return self.planner.budget()

    def next_plan(self, shape: tuple[int, ...], *, kind: str = "decode", choose: bool = True) -> budget.MemoryPlan:
        """The plan below the one that ran out of memory, chosen to run next (only reported with ``choose=False``).

        Raises:
            MemoryBudgetError: no smaller plan exists.
        """
        return self.planner.smaller(kind, tuple(shape), choose_it=choose)

    def reset_programs(self) -> None:
        """Starts the programs afresh (the module's tiling switches are read while tracing) and forgets every plan."""
        ahead_of_time.reset_programs(self)

    def compiled_shapes(self, kind: str = "decode") -> list[tuple[int, ...]]:
        """The input shapes that have a compiled ``kind`` (``"decode"`` or ``"encode"``) program, oldest first."""
        return ahead_of_time.compiled_shapes(self.planner, kind)

    def clear_compiled(self, *, jax_caches: bool = False) -> None:
        """Drops this VAE's compiled programs (one is kept per input shape, encode and decode).

        Each shape keeps its executable in host memory until this is called;
        copies of the weights on other meshes go too, and so do the CPU
        programs' transposed convolution weights (made again on the next call). ``jax_caches`` also
        calls `jax.clear_caches()` (every jitted function in the process
        recompiles on its next call).
        """
        ahead_of_time.clear_compiled(self, jax_caches)

    def __repr__(self) -> str:
        mesh = ",".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        return (
            f"TorchaxVAE({self.family.class_name}, dtype={self.options.dtype}, mesh={mesh}, "
            f"latent_channels={self.family.latent_channels(self.config)}, plan={self.plan})"
        )
