"""`TorchaxVAE`: the patched upstream VAE, encoding and decoding as jits over a mesh."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from jax.sharding import Mesh

from cogvideox_torchax import budget, distributed, patches, sharding, targets
from cogvideox_torchax.config import RuntimeOptions
from cogvideox_torchax.plan import RunPlan, Target, build_plan, canonical_platform, mesh_platform
from cogvideox_torchax.program import Program, tiling_switches

# torchax computes some index arithmetic in int64; with x64 off JAX narrows it
# to int32 (harmless at these sizes) and warns on every trace.
_INT64_WARNING = "Explicitly requested dtype int64"


def _to_host_torch(x: jax.Array) -> torch.Tensor:
    arr = np.array(distributed.to_host(x))  # every shard, from every process; a writable copy
    if arr.dtype == np.dtype(jax.numpy.bfloat16):
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _torch_device_of(x: Any, default: torch.device) -> torch.device:
    # Results go back where a torch input came from, so a pipeline running on
    # another torch device gets its tensors where it expects them.
    return x.device if isinstance(x, torch.Tensor) else default


def _to_numpy(x: torch.Tensor | np.ndarray | jax.Array, np_dtype: Any) -> np.ndarray | jax.Array:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    if isinstance(x, jax.Array):
        return x.astype(np_dtype)
    return np.asarray(x).astype(np_dtype, copy=False)


def _check_5d(shape: tuple[int, ...], what: str, layout: str, channels: int) -> None:
    if len(shape) != 5:
        raise ValueError(f"{what} must be {layout}, got shape {tuple(shape)}")
    if shape[1] != channels:
        raise ValueError(f"{what} must have {channels} channels (dim 1), got shape {tuple(shape)}")
    if min(shape) < 1:
        raise ValueError(f"{what} shape {tuple(shape)} has an empty dimension")


# What `TorchaxVAE` offers of upstream's surface; other upstream attributes
# raise `UnsupportedAttributeError` naming this list.
INFERENCE_SURFACE = (
    "decode",
    "encode",
    "forward",
    "enable_tiling",
    "disable_tiling",
    "enable_slicing",
    "disable_slicing",
    "use_tiling",
    "use_slicing",
    "config",
    "dtype",
    "device",
    "to",
    "eval",
    "train",
    "training",
    "requires_grad_",
)


def _compiler_options(plan: RunPlan) -> dict[str, str] | None:
    # XLA:CPU deletes the optimization barriers of `patches.CacheFirstCausalConv3d` unless told.
    if plan.applies("cache_first") and plan.target.platform == "cpu":
        return dict(patches.KEEP_BARRIERS_COMPILER_OPTIONS)
    return None


def _no_compile_cache():
    from jax._src import config

    return config.enable_compilation_cache(False)


def _plan_key(plan: budget.MemoryPlan) -> tuple | None:
    """The program key of a memory plan: its mesh, with its target when it has one."""
    return plan.mesh if plan.target is None else (plan.target, *plan.mesh)


class UnsupportedAttributeError(AttributeError, NotImplementedError):
    """An `AutoencoderKLCogVideoX` attribute that `TorchaxVAE` does not offer.

    Both an AttributeError (so ``hasattr`` and ``getattr(obj, name, default)``
    answer "absent", as diffusers' pipelines probe components) and a
    NotImplementedError (it exists upstream, just not here).
    """


class TorchaxVAE:
    """Upstream `AutoencoderKLCogVideoX`, patched, run by torchax under `jax.jit`.

    Build it with `cogvideox_torchax.from_pretrained` or `cogvideox_torchax.wrap`.
    Weights live on the mesh's devices as JAX arrays and are passed to the jitted
    encode and decode as arguments, so one compiled program serves any weights of
    the same config, and one program is compiled per input shape.

    It stands in for the upstream module wherever inference code uses one
    (e.g. ``pipe.vae`` of diffusers' CogVideoX pipelines): `decode`, `encode`,
    `forward` (also by calling it), `enable_tiling` / `disable_tiling`,
    `enable_slicing` / `disable_slicing`, `config`, `dtype`, `device` and
    `to`. Any other upstream attribute (training, saving, hooks, submodules)
    raises `UnsupportedAttributeError` instead of running eager torch.
    """

    def __init__(
        self,
        module: AutoencoderKLCogVideoX,
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
        self._options = options
        self._mesh = mesh
        self._max_memory = budget.parse_memory(max_memory)
        module.eval()
        self._platform = mesh_platform(mesh)
        # An unpatched copy (structure only on the meta device) from which a
        # program for another platform or tiling is built (`lower_decode(...,
        # platform=)`, the memory planner); the mesh's own program patches
        # ``module`` itself.
        self._pristine = copy.deepcopy(module)
        # Programs by (platform, tiling, mesh): tiling None is the module's own
        # switches, mesh None the VAE's own (else a (dp, tp) the planner tried).
        self._programs = {(self._platform, None, None): Program(module, self._plan_for(self._platform), mesh)}
        self._other_meshes: dict[tuple[int, int], Mesh] = {}
        self._other_weights: dict[tuple[int, int], dict[str, jax.Array]] = {}
        self._capacity: tuple[int, str] | None = None
        self._memory_plans: dict[tuple[str, tuple[int, ...]], budget.MemoryPlan] = {}
        # Where results go for inputs that are not torch tensors; `to` moves it.
        self._device = torch.device("cpu")

        np_dtype = np.dtype(options.jax_dtype)
        weights_sharding = sharding.replicated(mesh)
        self._weights = {
            name: sharding.place(_to_numpy(t, np_dtype), weights_sharding) for name, t in state_dict.items()
        }

    # -- programs -----------------------------------------------------------

    def _plan_for(self, platform: str, mesh: Mesh | None = None) -> RunPlan:
        return build_plan(self._options, Target.of(mesh or self._mesh, self._options.dtype, platform))

    def _mesh_of(self, mesh: tuple | None) -> Mesh:
        """The mesh of a plan (None: the VAE's own; ``(target, dp, tp)``: a target's compile-only devices)."""
        if mesh is None:
            return self._mesh
        if len(mesh) == 3:
            return targets.target_mesh(mesh[0], mesh[1:])
        if mesh not in self._other_meshes:
            self._other_meshes[mesh] = sharding.make_mesh(mesh, devices=self._platform_devices())
        return self._other_meshes[mesh]

    def _on(self, mesh: tuple[int, int] | None) -> tuple[Mesh, dict[str, jax.Array]]:
        """The mesh of a plan and the weights placed on it (copied there on first use: only a chosen plan runs)."""
        if mesh is None:
            return self._mesh, self._weights
        if mesh not in self._other_weights:
            replicated = sharding.replicated(self._mesh_of(mesh))
            self._other_weights[mesh] = {k: jax.device_put(w, replicated) for k, w in self._weights.items()}
        return self._mesh_of(mesh), self._other_weights[mesh]

    def _weight_specs(self, mesh: tuple[int, int] | None) -> dict[str, Any]:
        """What tracing needs of the weights: the arrays on the VAE's mesh, shapes and shardings elsewhere."""
        if mesh is None:
            return self._weights
        replicated = sharding.replicated(self._mesh_of(mesh))
        return {k: jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=replicated) for k, w in self._weights.items()}

    def _platform_devices(self) -> list[jax.Device]:
        own = self._mesh.devices.flat[0]
        return [d for d in jax.devices(own.platform) if d.platform == own.platform]

    def _program(
        self, platform: str | None = None, tiling: dict[str, Any] | None = None, mesh: tuple[int, int] | None = None
    ) -> Program:
        if mesh is not None and len(mesh) == 3:
            platform = targets.get(mesh[0]).platform
        platform = self._platform if platform is None else canonical_platform(platform)
        key = (platform, None if tiling is None else tuple(sorted(tiling.items())), mesh)
        if key not in self._programs:
            module = copy.deepcopy(self._pristine)
            vars(module).update(tiling_switches(self.module))
            if tiling is not None:
                module.enable_tiling(**tiling)
            on = self._mesh_of(mesh)
            self._programs[key] = Program(module, self._plan_for(platform, on), on)
        return self._programs[key]

    @property
    def plan(self) -> RunPlan:
        """What runs on the mesh's platform: patches, convolution layout and policy (`cogvideox_torchax.plan`)."""
        return self._program().plan

    def plan_for(self, platform: str) -> RunPlan:
        """What would run if this VAE's program were built for ``platform`` (``"cpu"``, ``"cuda"``, ``"tpu"``)."""
        return self._program(platform).plan

    @property
    def platform(self) -> str:
        """The platform the mesh's devices are (``"cpu"``, ``"cuda"``, ``"rocm"`` or ``"tpu"``)."""
        return self._platform

    # -- properties ---------------------------------------------------------

    @property
    def config(self) -> Any:
        """The upstream diffusers config (a read-only mapping with attributes)."""
        return self.module.config

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the weights, of decoded samples and of encoder moments."""
        return self._options.torch_dtype

    @property
    def device(self) -> torch.device:
        """The torch device results land on when the input is not a torch tensor (CPU unless `to` moved it).

        Torch inputs get their results on their own device, whatever this says;
        the computation itself runs on the mesh's devices.
        """
        return self._device

    @property
    def options(self) -> RuntimeOptions:
        return self._options

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def module(self) -> AutoencoderKLCogVideoX:
        """The patched upstream module of the mesh's platform (structure only; weights are `weights`)."""
        return self._programs[(self._platform, None, None)].module


    @property
    def weights(self) -> dict[str, jax.Array]:
        """The state dict as JAX arrays on the mesh, in `dtype`."""
        return self._weights

    @property
    def use_tiling(self) -> bool:
        return bool(self.module.use_tiling)

    @property
    def use_slicing(self) -> bool:
        return bool(self.module.use_slicing)

    # -- decode -------------------------------------------------------------

    def check_latents(self, shape: tuple[int, ...]) -> None:
        """Raises ValueError unless ``shape`` is a decodable (B, C, T, H, W)."""
        _check_5d(shape, "latents", "(B, C, T, H, W)", self.config.latent_channels)

    def _device_input(self, x: torch.Tensor | np.ndarray | jax.Array, mesh: Mesh | None = None) -> jax.Array:
        arr = _to_numpy(x, np.dtype(self._options.jax_dtype))
        return sharding.place(arr, sharding.input_sharding(arr.shape, mesh or self._mesh))

    def _prepare(self, kind: str, x: torch.Tensor | np.ndarray | jax.Array) -> tuple[jax.stages.Compiled, tuple]:
        """The planned ``kind`` executable for ``x`` and its arguments: the weights and ``x`` on the plan's mesh."""
        executable = self._compile(kind, tuple(x.shape))
        mesh, weights = self._on(self.memory_plan(tuple(x.shape), kind=kind).mesh)
        return executable, (weights, self._device_input(x, mesh))

    def _execute(self, kind: str, x: torch.Tensor | np.ndarray | jax.Array) -> Any:
        executable, args = self._prepare(kind, x)
        return executable(*args)

    def _run(self, kind: str, x: torch.Tensor | np.ndarray | jax.Array) -> jax.Array:
        # With slicing on (upstream's enable_slicing), one batch element at a
        # time: one executable for batch 1, results joined on device. Each
        # part is placed anew, as a compiled program takes only the argument
        # sharding it was compiled for.
        if not self.use_slicing or x.shape[0] == 1:
            return self._execute(kind, x)
        outs = [self._execute(kind, x[i : i + 1]) for i in range(x.shape[0])]
        return jax.numpy.concatenate(outs, axis=0)

    def decode_jax(self, z: torch.Tensor | np.ndarray | jax.Array) -> jax.Array:
        """Decodes on device and returns the JAX array (no host copy).

        Args:
            z: latents ``(B, C, T, H, W)``, already divided by the scaling factor
                as for upstream `decode`.

        Returns:
            Video ``(B, 3, F, 8H, 8W)`` in `dtype`, unclamped as upstream
            (the video processor clamps to [-1, 1] later); ``F`` is 1 for
            ``T = 1``, ``4 T`` for even ``T`` and ``4 T - 3`` for odd ``T > 1``
            (13 latent frames give 49). With slicing enabled, one batch
            element is decoded at a time.
        """
        self.check_latents(tuple(z.shape))
        return self._run("decode", z)

    def decode_frames_jax(self, z: torch.Tensor | np.ndarray | jax.Array) -> tuple[jax.Array, jax.Array]:
        """Decodes straight to video frames on device: what an mp4 or PNG writer takes.

        The [-1, 1] -> uint8 mapping of diffusers' video processor runs inside
        the jitted program, so what leaves the device is a quarter (fp32) or
        half (bf16) of the decoder's output.

        Returns:
            ``(frames, finite)``: uint8 ``(B, F, 8H, 8W, 3)``, and bool
            ``(B,)``, False for a video whose decoder output held NaN or
            Inf (its frames are then garbage).
        """
        self.check_latents(tuple(z.shape))
        if not self.use_slicing or z.shape[0] == 1:
            return self._execute("frames", z)
        parts = [self.decode_frames_jax(z[i : i + 1]) for i in range(z.shape[0])]
        frames = jax.numpy.concatenate([f for f, _ in parts], axis=0)
        return frames, jax.numpy.concatenate([ok for _, ok in parts])

    def decode(
        self, z: torch.Tensor | np.ndarray | jax.Array, return_dict: bool = True
    ) -> DecoderOutput | tuple[torch.Tensor]:
        """Drop-in for upstream ``vae.decode(z)``.

        Args:
            z: latents ``(B, C, T, H, W)`` as upstream takes them.
            return_dict: as upstream: a `DecoderOutput` or a 1-tuple.

        Returns:
            The decoded video as a torch tensor in `dtype`, equal to
            upstream's ``vae.decode(z).sample``, on ``z``'s device for a
            torch ``z`` (else on `device`, the CPU by default).
        """
        sample = _to_host_torch(self.decode_jax(z)).to(_torch_device_of(z, self._device))
        if not return_dict:
            return (sample,)
        return DecoderOutput(sample=sample)

    def lower_decode(
        self, shape: tuple[int, ...], *, platform: str | None = None, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Lowered:
        """Traces and lowers the decode for a latent shape without running it.

        ``lower_decode(shape).compile().memory_analysis()`` gives the compiled
        program's per-device temporary and argument bytes.

        Args:
            shape: latents ``(B, C, T, H, W)``.
            platform: build the program for this platform (``"cpu"``,
                ``"cuda"``, ``"rocm"``, ``"tpu"``) with its own plan
                (`plan_for`) instead of the mesh's; JAX lowers for any
                platform without its hardware, but only the mesh's own
                program can be compiled here.
            target, mesh: lower for a named accelerator's compile-only
                devices instead (`cogvideox_torchax.targets`: ``"h100"``,
                ``"h200"``, ``"v5e-1"``, ``"v5e-8"``, ``"v6e-1"``,
                ``"v6e-8"``), over ``mesh`` (``"dp=1,tp=8"``; default every
                device of the target on ``tp``); the result compiles here
                with that accelerator's real compiler (the ``aot`` extra).
        """
        shape = tuple(shape)
        self.check_latents(shape)
        if target is not None:
            return self._lower("decode", shape, None, None, self._target_key(target, mesh))
        return self._lower("decode", shape, platform)

    @staticmethod
    def _target_key(target: str, mesh: Any) -> tuple[str, int, int]:
        on = targets.target_mesh(target, mesh)
        return (targets.get(target).name, on.shape["dp"], on.shape["tp"])

    def _lower(
        self,
        kind: str,
        shape: tuple[int, ...],
        platform: str | None,
        tiling: dict[str, Any] | None = None,
        mesh: tuple[int, int] | None = None,
    ) -> jax.stages.Lowered:
        program = self._program(platform, tiling, mesh)
        on = self._mesh_of(mesh)
        spec = jax.ShapeDtypeStruct(shape, self._options.jax_dtype, sharding=sharding.input_sharding(shape, on))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_INT64_WARNING)
            traced = program.jits[kind].trace(self._weight_specs(mesh), spec)
            if program.plan.target.platform == self._platform or (mesh is not None and len(mesh) == 3):
                return traced.lower()
            return traced.lower(lowering_platforms=(program.plan.target.platform,))

    def _compile_with(
        self, kind: str, shape: tuple[int, ...], tiling: dict[str, Any] | None, mesh: tuple[int, int] | None = None
    ) -> jax.stages.Compiled:
        program = self._program(tiling=tiling, mesh=mesh)
        key = (kind, shape)
        if key not in program.executables:
            lowered = self._lower(kind, shape, None, tiling, mesh)
            # A compile-only device's executable cannot be read back from JAX's persistent cache.
            cache = contextlib.nullcontext() if mesh is None or len(mesh) != 3 else _no_compile_cache()
            with cache:
                program.executables[key] = lowered.compile(compiler_options=_compiler_options(program.plan))
        return program.executables[key]

    def _drop(self, kind: str, shape: tuple[int, ...], tiling: dict[str, Any] | None, mesh: tuple[int, int] | None):
        self._program(tiling=tiling, mesh=mesh).executables.pop((kind, shape), None)

    def _compile(self, kind: str, shape: tuple[int, ...], target: str | None = None, mesh: Any = None):
        shape = tuple(shape)
        (self.check_video if kind == "encode" else self.check_latents)(shape)
        plan = self.memory_plan(shape, kind=kind, target=target, mesh=mesh)
        return self._compile_with(kind, shape, plan.tiling, _plan_key(plan))

    def _candidates(self, kind: str, shape: tuple[int, ...], on: tuple | None = None) -> list[budget.Candidate]:
        scale = 2 ** (len(self.config.block_out_channels) - 1)
        frame = shape[-2:] if kind != "encode" else tuple(-(-n // scale) for n in shape[-2:])
        first = "tiled as set" if self.use_tiling else "whole"
        overlaps = (self.module.tile_overlap_factor_height, self.module.tile_overlap_factor_width)
        if on is not None:  # a target: its devices, plans keyed by (target, dp, tp)
            wider = [c._replace(mesh=(on[0], *c.mesh))
                     for c in budget.tp_candidates(on[1:], targets.get(on[0]).devices, first)]
            return [budget.Candidate(first, None, on), *(c._replace(mesh=on) for c in
                    budget.tiled_candidates(frame, scale, overlaps)), *wider]
        # Other meshes only within one process: under jax.distributed a mesh uses every device already.
        devices = len(self._platform_devices()) if jax.process_count() == 1 else 0
        return [
            budget.Candidate(first, None, None),
            *budget.tiled_candidates(frame, scale, overlaps),
            *budget.tp_candidates((self._mesh.shape["dp"], self._mesh.shape["tp"]), devices, first),
        ]

    def memory_candidates(self, shape: tuple[int, ...], *, kind: str = "decode") -> list[budget.MemoryPlan]:
        """Every candidate plan of `memory_plan` with its compiled bytes, in order (all compiled; none run)."""
        shape = tuple(shape)
        (self.check_video if kind == "encode" else self.check_latents)(shape)
        plans = []
        for c in self._candidates(kind, shape):
            need = budget.compiled_bytes(self._compile_with(kind, shape, c.tiling, c.mesh))
            self._drop(kind, shape, c.tiling, c.mesh)
            plans.append(budget.MemoryPlan(c.name, c.tiling, need, None, c.mesh))
        return plans

    def planned(self, shape: tuple[int, ...], *, kind: str = "decode") -> budget.MemoryPlan | None:
        """The plan `memory_plan` chose for a shape, or None if it has not planned it (compiles nothing)."""
        return self._memory_plans.get((kind, tuple(shape)))

    def memory_plan(
        self, shape: tuple[int, ...], *, kind: str = "decode", target: str | None = None, mesh: Any = None
    ) -> budget.MemoryPlan:
        """How a shape runs within the memory budget, compiling candidates (running nothing) on first use.

        Candidates in order of expected speed: the whole program (with the
        VAE's own tiling switches), then upstream's tiling with growing
        tile counts (`budget.tiled_candidates`), then, when the mesh leaves
        devices of its platform unused (one process), the whole program on
        meshes with more devices on ``tp`` (`budget.tp_candidates`; the
        weights are copied there when chosen). The first whose compiled
        temporaries + arguments + outputs fit the budget, less
        `budget.SAFETY_MARGIN`, is the plan; `decode` and `encode` run it.
        The budget is ``max_memory`` (``"auto"``: the device's capacity,
        `budget.device_capacity`).

        Args:
            shape: latents ``(B, C, T, H, W)`` for ``kind="decode"``, a video
                ``(B, C, F, H, W)`` for ``"encode"``.
            kind: ``"decode"`` or ``"encode"``.
            target, mesh: plan for a named accelerator instead (as
                `lower_decode` takes them): candidates compiled by its real
                compiler, the budget its per-device `targets.Accelerator.budget`
                (or ``max_memory`` when given), wider meshes up to its devices.

        Raises:
            MemoryBudgetError: no candidate fits; says what each needs.
        """
        shape = tuple(shape)
        on = None if target is None else self._target_key(target, mesh)
        key = (kind, shape) if on is None else (kind, shape, on)
        if key in self._memory_plans:
            return self._memory_plans[key]
        if on is not None:
            acc = targets.get(on[0])
            limit, source = (self._max_memory, "max_memory") if self._max_memory else (acc.budget, acc.name)
        else:
            limit, source = self.memory_budget()
        return self._plan(kind, shape, budget.usable(limit), f"({source} {budget.human(limit)} less "
                          f"{budget.SAFETY_MARGIN:.0%} margin)", on)

    def memory_budget(self) -> tuple[int, str]:
        """The per-device bytes plans must fit (before `budget.SAFETY_MARGIN`), and where the figure comes from.

        ``max_memory`` as given, or for ``"auto"`` the device's capacity
        (`budget.device_capacity`). Under jax.distributed the capacity is the
        least over every process, asked once: a collective, so every process
        must make its first call together (the command lines do, right after
        loading the model; otherwise the first plan does).
        """
        if self._max_memory is not None:
            return self._max_memory, "max_memory"
        return self._device_capacity()

    def _device_capacity(self) -> tuple[int, str]:
        # Under jax.distributed every process must choose the same plan (they
        # run one program): the smallest capacity of any process's devices.
        # Asked once, by every process together (the command lines right after
        # loading); one process asks at every plan (the host's free memory changes).
        if jax.process_count() == 1:
            return budget.device_capacity(self._mesh)
        if self._capacity is None:
            limit, source = budget.device_capacity(self._mesh)
            limit = min(distributed.gather_codes(limit // 2**20)) * 2**20
            self._capacity = (limit, f"{source}, least of {jax.process_count()} processes")
        return self._capacity

    def next_plan(self, shape: tuple[int, ...], *, kind: str = "decode", choose: bool = True) -> budget.MemoryPlan:
        """Plans ``shape`` again below the plan that ran out of memory, and returns the new plan (run next).

        For a program that compiled within the budget and still failed to
        run (the device had less free than it said): the first candidate
        whose compiled bytes are smaller than the failed plan's, by the same
        rule as `memory_plan`. With ``choose=False`` the shape keeps its
        plan (the smaller one is only reported, e.g. in an error message).

        Raises:
            MemoryBudgetError: no smaller plan exists.
        """
        shape = tuple(shape)
        failed = self.memory_plan(shape, kind=kind)
        self._memory_plans.pop((kind, shape))
        executables = self._program(tiling=failed.tiling, mesh=failed.mesh).executables
        kept = executables.get((kind, shape))
        try:
            smaller = self._plan(kind, shape, failed.bytes - 1, f"(below the {failed.name} plan's "
                                 f"{budget.human(failed.bytes)}, which ran out of memory)")
        finally:
            if not choose:  # as it was: the plan and its executable
                self._memory_plans[(kind, shape)] = failed
                if kept is not None:
                    executables[(kind, shape)] = kept
        if not choose:
            self._drop(kind, shape, smaller.tiling, smaller.mesh)
            return smaller
        self._drop(kind, shape, failed.tiling, failed.mesh)
        if failed.mesh is not None and all(p.mesh != failed.mesh for p in self._memory_plans.values()):
            self._other_weights.pop(failed.mesh, None)  # no plan runs there now: its weight copy goes
        return smaller

    def _plan(self, kind: str, shape: tuple[int, ...], usable: int, why: str, on: tuple | None = None):
        key = (kind, shape) if on is None else (kind, shape, on)
        tried: list[str] = []
        previous = None
        tiles_done = False
        for c in self._candidates(kind, shape, on):
            if tiles_done and c.mesh == on:
                continue
            need = self._compiled_need(kind, shape, c.tiling, c.mesh)
            tried.append(f"{c.name} {budget.human(need)}")
            if need <= usable:
                if c.mesh is not None and len(c.mesh) == 3:
                    plan = budget.MemoryPlan(c.name, c.tiling, need, usable, c.mesh[1:], c.mesh[0])
                else:
                    plan = budget.MemoryPlan(c.name, c.tiling, need, usable, c.mesh)
                self._memory_plans[key] = plan
                return plan
            # Not kept: it will not run here.
            self._drop(kind, shape, c.tiling, c.mesh)
            if c.tiling is not None and previous is not None and need >= previous:
                # Smaller tiles stopped saving memory (blending and per-tile
                # work dominate): on to more devices, if any.
                tiles_done = True
            previous = need if c.tiling is not None else None
        raise budget.MemoryBudgetError(
            f"no plan for the {'decode' if kind == 'frames' else kind} of {shape} fits {budget.human(usable)} "
            f"per device {why}: {'; '.join(tried)}; "
            "give more memory (max_memory / --max-memory) or a mesh with more devices on tp"
        )

    def _compiled_need(self, kind: str, shape: tuple[int, ...], tiling: dict[str, Any] | None, mesh: tuple | None):
        try:
            return budget.compiled_bytes(self._compile_with(kind, shape, tiling, mesh))
        except Exception as e:  # the TPU compiler refuses programs above its HBM, naming their size
            need = budget.refused_bytes(e)
            if need is None:
                raise
            return need

    def compile_decode(
        self, shape: tuple[int, ...], *, frames: bool = False, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Compiled:
        """The compiled decode for a latent shape (of `decode_frames_jax` with ``frames``), compiled on first use.

        ``target`` and ``mesh`` compile the planned program for a named
        accelerator (see `lower_decode`); it cannot run here.
        """
        return self._compile("frames" if frames else "decode", shape, target, mesh)

    @property
    def compiler_options(self) -> dict[str, str] | None:
        """XLA options `compile_decode` and `compile_encode` pass; use them to compile a `lower_*` result yourself.

        On the CPU backend this keeps the optimization barriers of
        `patches.CacheFirstCausalConv3d`, which XLA:CPU otherwise deletes.
        """
        return _compiler_options(self.plan)

    # -- encode -------------------------------------------------------------

    def check_video(self, shape: tuple[int, ...]) -> None:
        """Raises ValueError unless ``shape`` is an encodable (B, C, F, H, W) video.

        Any frame count and size are accepted, as upstream accepts them; the
        counts ``8 k + 1`` (1, 9, ..., 49) and sizes divisible by 8 decode
        back to the same frame count and size.
        """
        _check_5d(shape, "video", "(B, C, F, H, W)", self.config.in_channels)

    def encode_jax(self, x: torch.Tensor | np.ndarray | jax.Array) -> jax.Array:
        """Encodes on device and returns the encoder's moments as a JAX array (no host copy).

        Args:
            x: video ``(B, 3, F, H, W)`` in [-1, 1].

        Returns:
            ``(B, 2 C, T, H', W')`` in `dtype`: the posterior's mean then its
            (unclamped) log-variance along dim 1, as upstream's ``_encode``
            returns them. With slicing enabled, one batch element at a time.
        """
        self.check_video(tuple(x.shape))
        return self._run("encode", x)

    def encode(
        self, x: torch.Tensor | np.ndarray | jax.Array, return_dict: bool = True
    ) -> AutoencoderKLOutput | tuple[DiagonalGaussianDistribution]:
        """Drop-in for upstream ``vae.encode(x)``.

        Args:
            x: video ``(B, 3, F, H, W)`` in [-1, 1].
            return_dict: as upstream: an `AutoencoderKLOutput` or a 1-tuple.

        Returns:
            Upstream's own `DiagonalGaussianDistribution` (as ``.latent_dist``)
            over the moments, built on the host in torch on ``x``'s device
            (else on `device`): ``.mode()``, ``.mean``, ``.logvar``, ``.std``
            and ``.sample(generator=...)`` behave exactly as upstream's.
        """
        posterior = self.latent_dist(self.encode_jax(x), device=_torch_device_of(x, self._device))
        if not return_dict:
            return (posterior,)
        return AutoencoderKLOutput(latent_dist=posterior)

    def latent_dist(
        self, moments: jax.Array, device: torch.device | str | None = None
    ) -> DiagonalGaussianDistribution:
        """Upstream's `DiagonalGaussianDistribution` over `encode_jax`'s moments, built on the host in torch.

        Under jax.distributed every process must call it (the moments are
        gathered from every process).

        Args:
            moments: what `encode_jax` returned.
            device: the torch device of the distribution (default `device`).
        """
        return DiagonalGaussianDistribution(_to_host_torch(moments).to(self._device if device is None else device))

    def lower_encode(
        self, shape: tuple[int, ...], *, platform: str | None = None, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Lowered:
        """Traces and lowers the encode for a video shape without running it (arguments as in `lower_decode`)."""
        shape = tuple(shape)
        self.check_video(shape)
        if target is not None:
            return self._lower("encode", shape, None, None, self._target_key(target, mesh))
        return self._lower("encode", shape, platform)

    def compile_encode(
        self, shape: tuple[int, ...], *, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Compiled:
        """The compiled encode for a video shape, compiling it on first use (``target`` as in `compile_decode`)."""
        return self._compile("encode", shape, target, mesh)

    # -- upstream's inference surface ----------------------------------------

    def forward(
        self,
        sample: torch.Tensor,
        sample_posterior: bool = False,
        return_dict: bool = True,
        generator: torch.Generator | None = None,
    ) -> DecoderOutput | tuple[torch.Tensor]:
        """Upstream's ``forward``: encode, take the posterior's mode (or a sample), decode.

        Args:
            sample: video ``(B, 3, F, H, W)`` in [-1, 1].
            sample_posterior: decode ``latent_dist.sample(generator)`` instead
                of ``latent_dist.mode()``.
            return_dict: a `DecoderOutput` or a 1-tuple.
            generator: for the posterior sample.
        """
        posterior = self.encode(sample).latent_dist
        z = posterior.sample(generator=generator) if sample_posterior else posterior.mode()
        return self.decode(z, return_dict=return_dict)

    __call__ = forward

    def enable_tiling(
        self,
        tile_sample_min_height: int | None = None,
        tile_sample_min_width: int | None = None,
        tile_overlap_factor_height: float | None = None,
        tile_overlap_factor_width: float | None = None,
    ) -> None:
        """Upstream's ``enable_tiling`` (same arguments and defaults: 240x360 tiles, overlap 1/6 x 1/5).

        Videos and latents larger than one tile then encode and decode tile by
        tile with upstream's grid and blending; for the decode, equal-shape
        tiles are decoded together (see `cogvideox_torchax.tiling`). Compiled
        programs are dropped.
        """
        self.module.enable_tiling(
            tile_sample_min_height=tile_sample_min_height,
            tile_sample_min_width=tile_sample_min_width,
            tile_overlap_factor_height=tile_overlap_factor_height,
            tile_overlap_factor_width=tile_overlap_factor_width,
        )
        self._retrace()

    def disable_tiling(self) -> None:
        """Upstream's ``disable_tiling``; compiled programs are dropped."""
        self.module.disable_tiling()
        self._retrace()

    def enable_slicing(self) -> None:
        """Upstream's ``enable_slicing``: a batch is encoded and decoded one element at a time.

        Results are unchanged; device memory is that of batch 1, and one
        program (for batch 1) serves every batch size.
        """
        self.module.enable_slicing()

    def disable_slicing(self) -> None:
        """Upstream's ``disable_slicing``: whole batches again."""
        self.module.disable_slicing()

    def to(self, *args: Any, **kwargs: Any) -> TorchaxVAE:
        """Accepts upstream's ``.to(device)`` / ``.to(dtype)`` / ``.to(device, dtype)`` calls; returns self.

        The computation stays on the mesh. A device becomes `device` (where
        results of non-torch inputs go); a dtype must be `dtype`.

        Raises:
            NotImplementedError: a dtype other than `dtype` (build another VAE
                with ``wrap(..., dtype=...)`` instead).
        """
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != self.dtype:
            other = "float32" if self.dtype == torch.bfloat16 else "bfloat16"
            raise NotImplementedError(
                f"TorchaxVAE runs in {self.dtype} and cannot be cast to {dtype}; it runs in float32 or "
                f"bfloat16 only: wrap the upstream module again with dtype={other!r} for the other one"
            )
        if device is not None:
            self._device = torch.device(device)
        return self

    # Training scripts put a VAE they only encode with in inference mode;
    # these say yes to that and refuse anything else.

    @property
    def training(self) -> bool:
        """Always False: this VAE only runs inference."""
        return False

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
        # Only reached when ordinary lookup fails: tell upstream's other
        # attributes apart from plain typos.
        module = self.__dict__.get("_pristine")
        if not name.startswith("__") and module is not None and hasattr(module, name):
            raise UnsupportedAttributeError(
                f"TorchaxVAE does not offer AutoencoderKLCogVideoX.{name}: it runs only the inference "
                f"surface ({', '.join(INFERENCE_SURFACE)}) under JAX; use the upstream module for anything else",
                name=name,
                obj=self,
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    # -- compiled programs --------------------------------------------------

    def _retrace(self) -> None:
        # The module's tiling settings are read while tracing, and jax.jit
        # keys its trace cache on argument shapes only: start fresh programs
        # (the mesh's own keeps its patched module and its tiling switches).
        own = self._programs[(self._platform, None, None)]
        self._programs = {(self._platform, None, None): Program(own.module, own.plan, self._mesh)}
        self._memory_plans.clear()

    def compiled_shapes(self, kind: str = "decode") -> list[tuple[int, ...]]:
        """The input shapes that have a compiled ``kind`` (``"decode"`` or ``"encode"``) program, oldest first."""
        return [key[1] for key in self._memory_plans if len(key) == 2 and key[0] == kind]

    def clear_compiled(self, *, jax_caches: bool = False) -> None:
        """Drops this VAE's compiled programs (one is kept per input shape, encode and decode).

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
        for program in self._programs.values():
            program.executables.clear()
        self._memory_plans.clear()
        self._other_weights.clear()  # copies of the weights for plans on other meshes
        if jax_caches:
            jax.clear_caches()

    def __repr__(self) -> str:
        mesh = ",".join(f"{k}={v}" for k, v in self._mesh.shape.items())
        return (
            f"TorchaxVAE(dtype={self._options.dtype}, mesh={mesh}, latent_channels={self.config.latent_channels}, "
            f"plan={self.plan})"
        )
