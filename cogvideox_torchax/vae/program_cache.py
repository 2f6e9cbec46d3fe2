"""The programs of one VAE: one `Program` per `ProgramKey`, and the meshes and weight copies they run on.

Threads: a `ProgramCache` builds, traces, compiles and changes what it
keeps under its ``lock`` (re-entrant, shared with the caches `converted`
makes, so one VAE has one lock); `ready` reads what is already built
without it. Tracing anywhere in the process also holds `TRACING`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import torch
from jax.sharding import Mesh

from cogvideox_torchax import families
from cogvideox_torchax.memory import budget
from cogvideox_torchax.options import RuntimeOptions
from cogvideox_torchax.parallel import distributed, sharding
from cogvideox_torchax.platforms import accelerators
from cogvideox_torchax.platforms.build import build_plan, compiler_options
from cogvideox_torchax.platforms.profiles import canonical_platform, mesh_platform
from cogvideox_torchax.platforms.run_plan import Placement, RunPlan
from cogvideox_torchax.vae import drawn_noise
from cogvideox_torchax.vae.program import Program, tiling_switches
from cogvideox_torchax.vae.weight_layout import WeightLayout

# torchax computes some index arithmetic in int64; with x64 off JAX narrows it
# to int32 (harmless at these sizes) and warns on every trace.
_INT64_WARNING = "Explicitly requested dtype int64"

# Held while any program in the process is traced and lowered. Tracing runs
# upstream's module through torchax with its parameters swapped for the
# traced weights (``torch.func``-style reparametrization) inside torchax
# environments shared by every VAE (`patches.traced_environment`), and
# filters warnings (``warnings.catch_warnings`` is process-wide): two traces
# at once would see each other's weights. Taken inside a cache's ``lock``,
# never the other way round.
TRACING = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ProgramKey:
    """Which program: what it is built for, with which tiling, over which mesh.

    Attributes:
        target: None for the VAE's own devices; a platform (``"cpu"``,
            ``"cuda"``, ``"rocm"``, ``"tpu"``) for a program only lowered for
            it; or a named accelerator (`accelerators.TARGETS`), whose
            compile-only devices it compiles for.
        tiling: `enable_tiling` keywords as sorted items; None keeps the
            module's own switches.
        mesh: ``(dp, tp)``; None is the VAE's own mesh (a named
            accelerator's key always names its mesh).
    """

    target: str | None = None
    tiling: tuple[tuple[str, Any], ...] | None = None
    mesh: tuple[int, int] | None = None

    @classmethod
    def of(cls, target: str | None = None, tiling: Mapping[str, Any] | None = None, mesh=None) -> ProgramKey:
        """A key from `enable_tiling` keywords as a mapping."""
        return cls(target, None if tiling is None else tuple(sorted(tiling.items())), mesh)

    @classmethod
    def for_target(cls, target: str, mesh: Any = None) -> ProgramKey:
        """The key of a named accelerator's program over ``mesh`` (``"dp=1,tp=8"``; default all on ``tp``)."""
        on = accelerators.target_mesh(target, mesh)
        return cls(accelerators.get(target).name, None, (on.shape["dp"], on.shape["tp"]))

    @property
    def tiling_kwargs(self) -> dict[str, Any] | None:
        return None if self.tiling is None else dict(self.tiling)

    @property
    def accelerator(self) -> accelerators.Accelerator | None:
        """The named accelerator the key compiles for, or None."""
        return accelerators.TARGETS.get(self.target) if self.target is not None else None


def to_numpy(x: torch.Tensor | np.ndarray | jax.Array, np_dtype: Any) -> np.ndarray | jax.Array:
    """A torch tensor, NumPy array or JAX array in ``np_dtype`` (a JAX array stays on its devices)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype == torch.bfloat16 and np.dtype(np_dtype) == np.dtype(jax.numpy.bfloat16):
            return x.view(torch.int16).numpy().view(np_dtype)  # NumPy has no bfloat16: its bits, not converted
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    if isinstance(x, jax.Array):
        return x.astype(np_dtype)
    return np.asarray(x).astype(np_dtype, copy=False)


def to_host_torch(x: jax.Array) -> torch.Tensor:
    """A JAX array (every shard, from every process) as a host torch tensor of its dtype."""
    arr = np.array(distributed.to_host(x))  # every shard, from every process; a writable copy
    if arr.dtype == np.dtype(jax.numpy.bfloat16):
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)



def _no_compile_cache():
    from jax._src import config

    return config.enable_compilation_cache(False)


class ProgramCache:
    """Programs by `ProgramKey`, each compiled once per input shape, and the weights on each key's mesh.

    The VAE's own program patches the module it is given; any other key's
    program patches a copy of an unpatched one (structure only), so a
    program for another platform, tiling or mesh can be built at any time.

    Every method may be called from several threads: building a program,
    tracing, compiling and changing what is kept happen under ``lock``, so
    each shape compiles once (other threads wait for it) and nothing is
    kept before it is whole; a failure keeps nothing.

    Attributes:
        family: the model family of the module (`cogvideox_torchax.families`).
        lock: the re-entrant lock of this cache and of those `converted`
            makes from it; hold it to change the own module (its tiling
            switches are read while tracing).
    """

    def __init__(self, module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor | jax.Array],
                 options: RuntimeOptions, mesh: Mesh, lock: threading.RLock | None = None):
        started = time.perf_counter()
        self.lock = lock if lock is not None else threading.RLock()
        self.options = options
        self.mesh = mesh
        self.family = families.of_module(module)
        module.eval()
        self._pristine = copy.deepcopy(module)
        self._programs = {ProgramKey(): Program(module, self.plan_for(ProgramKey()), mesh)}
        self._meshes: dict[tuple[int, int], Mesh] = {}
        self._copies: dict[tuple[int, int], dict[str, jax.Array]] = {}
        # (mesh, layout) -> the weights as a program of that layout takes them (`WeightLayout`).
        self._laid_out: dict[tuple[tuple[int, int] | None, WeightLayout], dict[str, jax.Array]] = {}
        wrapped = time.perf_counter()
        np_dtype = np.dtype(options.jax_dtype)
        self.weights = {
            name: sharding.place(to_numpy(t, np_dtype), sharding.replicated(mesh)) for name, t in state_dict.items()
        }
        # (part, start, end) in `time.perf_counter` seconds: what building this cache took (the commands'
        # timeline); `cogvideox_torchax.loading.build` adds the checks before it.
        self.load_times: list[tuple[str, float, float]] = [
            ("wrap", started, wrapped), ("weights", wrapped, time.perf_counter())
        ]

    def converted(self, options: RuntimeOptions) -> ProgramCache:
        """A fresh cache for ``options`` (another dtype): the weights converted once, on the same mesh.

        Nothing compiled is carried over (every plan depends on the dtype);
        the own module's tiling and slicing switches are.
        """
        with self.lock:
            module = copy.deepcopy(self._pristine)
            vars(module).update(tiling_switches(self.own.module))
            return ProgramCache(module, self.weights, options, self.mesh, self.lock)

    @property
    def own(self) -> Program:
        """The program of the VAE's own devices, tiling switches and mesh."""
        return self._programs[ProgramKey()]

    def platform(self, key: ProgramKey) -> str:
        """The platform ``key``'s program is built for."""
        if key.accelerator is not None:
            return key.accelerator.platform
        return canonical_platform(key.target) if key.target is not None else mesh_platform(self.mesh)

    def platform_key(self, platform: str | None) -> ProgramKey:
        """The key of a program built for ``platform`` on the VAE's mesh (the own program for its own platform)."""
        if platform is None or canonical_platform(platform) == mesh_platform(self.mesh):
            return ProgramKey()
        return ProgramKey(canonical_platform(platform))

    def plan_for(self, key: ProgramKey) -> RunPlan:
        placement = Placement.of(self.mesh_of(key), self.options.dtype, self.platform(key))
        return build_plan(self.options, placement, self.family.name)

    def mesh_of(self, key: ProgramKey) -> Mesh:
        """The mesh ``key``'s program runs over (a named accelerator's: compile-only devices)."""
        if key.accelerator is not None:
            return accelerators.target_mesh(key.target, key.mesh)
        if key.mesh is None:
            return self.mesh
        with self.lock:
            if key.mesh not in self._meshes:
                self._meshes[key.mesh] = sharding.make_mesh(key.mesh, devices=self.platform_devices())
            return self._meshes[key.mesh]

    def platform_devices(self) -> list[jax.Device]:
        """This process's devices of the VAE's own platform (those a wider mesh may use)."""
        own = self.mesh.devices.flat[0]
        return [d for d in jax.devices(own.platform) if d.platform == own.platform]

    def program(self, key: ProgramKey) -> Program:
        """``key``'s program, built on first use (kept only once whole)."""
        program = self._programs.get(key)
        if program is not None:
            return program
        with self.lock:
            if key not in self._programs:
                module = copy.deepcopy(self._pristine)
                vars(module).update(tiling_switches(self.own.module))
                if key.tiling is not None:
                    module.enable_tiling(**key.tiling_kwargs)
                self._programs[key] = Program(module, self.plan_for(key), self.mesh_of(key))
            return self._programs[key]

    def weights_on(self, key: ProgramKey) -> dict[str, jax.Array]:
        """The weights placed on ``key``'s mesh (copied there on first use: only a chosen plan runs)."""
        if key.mesh is None:
            return self.weights
        with self.lock:
            if key.mesh not in self._copies:
                replicated = sharding.replicated(self.mesh_of(key))
                self._copies[key.mesh] = {k: jax.device_put(w, replicated) for k, w in self.weights.items()}
            return self._copies[key.mesh]

    def weights_for(self, key: ProgramKey, kind: str) -> dict[str, jax.Array]:
        """The weights as ``key``'s program of ``kind`` takes them, on its mesh (`WeightLayout`; made on first use).

        Upstream's layout, or for a CPU program the convolution weights that
        ``kind`` reads transposed once, kept beside them.
        """
        layout = self.program(key).layout(kind)
        if not layout.transposed:
            return self.weights_on(key)
        with self.lock:
            if (key.mesh, layout) not in self._laid_out:
                own = self._laid_out.get((None, layout))
                if own is None:
                    own = layout.to_program(self.weights)
                # Another mesh gets the transposed copy only: its programs never read upstream's layout.
                self._laid_out[key.mesh, layout] = own if key.mesh is None else jax.device_put(
                    own, sharding.replicated(self.mesh_of(key)))
            return self._laid_out[key.mesh, layout]

    def ready(
        self, kind: str, shape: tuple[int, ...], key: ProgramKey
    ) -> tuple[jax.stages.Compiled, dict, Mesh] | None:
        """The kept executable of ``kind`` for ``shape``, its weights and its mesh, or None (builds nothing).

        Takes no lock: what it finds was kept whole, so threads run compiled
        shapes while another thread compiles. None for a named accelerator's
        key (its programs cannot run here).
        """
        if key.accelerator is not None:
            return None
        program = self._programs.get(key)
        executable = None if program is None else program.executables.get((kind, shape))
        weights = self.weights if key.mesh is None else self._copies.get(key.mesh)
        if program is not None and program.layout(kind).transposed:
            weights = self._laid_out.get((key.mesh, program.layout(kind)))
        mesh = self.mesh if key.mesh is None else self._meshes.get(key.mesh)
        if executable is None or weights is None or mesh is None:
            return None
        return executable, weights, mesh

    def copied_to(self) -> list[tuple[int, int]]:
        """The meshes (``(dp, tp)``) that hold a copy of the weights."""
        return list(dict.fromkeys([*self._copies, *(mesh for mesh, _ in self._laid_out if mesh is not None)]))

    def forget_copy(self, mesh: tuple[int, int]) -> None:
        """Drops the weights' copy on ``mesh`` (no plan runs there any more)."""
        with self.lock:
            self._copies.pop(mesh, None)
            for laid_out in [k for k in self._laid_out if k[0] == mesh]:
                del self._laid_out[laid_out]

    def weight_specs(self, key: ProgramKey, kind: str) -> dict[str, Any]:
        """What tracing ``key``'s program of ``kind`` needs of the weights, in the layout it takes them.

        Upstream's arrays on the own mesh where it takes upstream's layout;
        else their shapes, dtypes and shardings (`WeightLayout.specs`).
        """
        if key.mesh is None:
            specs = self.weights
        else:
            replicated = sharding.replicated(self.mesh_of(key))
            specs = {k: jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=replicated) for k, w in self.weights.items()}
        layout = self.program(key).layout(kind)
        return layout.specs(specs) if layout.transposed else specs

    def input_specs(self, shape: tuple[int, ...], mesh: Mesh, program: Program) -> tuple[jax.ShapeDtypeStruct, ...]:
        """Specs of what a decode of latents ``shape`` by ``program`` takes after them.

        The family's decode inputs (`Family.decode_inputs`), one value per
        video, then the noise upstream's decode draws (`drawn_noise.shapes`,
        with the program's tiling and slicing), whole on every device.
        """
        config = self.own.module.config
        where = sharding.input_sharding((shape[0],), mesh)
        per_video = tuple(jax.ShapeDtypeStruct((shape[0],), self.options.jax_dtype, sharding=where)
                          for _ in self.family.decode_inputs(config))
        draws = drawn_noise.shapes(self.family, config, shape, tiling_switches(program.module))
        whole = sharding.replicated(mesh)
        return per_video + tuple(jax.ShapeDtypeStruct(s, self.options.jax_dtype, sharding=whole) for s in draws)

    def lower(self, kind: str, shape: tuple[int, ...], key: ProgramKey) -> jax.stages.Lowered:
        """Traces and lowers ``kind`` (``"decode"``, ``"frames"``, ``"encode"``) for an input shape."""
        with self.lock:
            program = self.program(key)
            on = self.mesh_of(key)
            spec = jax.ShapeDtypeStruct(shape, self.options.jax_dtype, sharding=sharding.input_sharding(shape, on))
            inputs = self.input_specs(shape, on, program) if kind != "encode" else ()
            with TRACING, warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_INT64_WARNING)
                traced = program.jits[kind].trace(self.weight_specs(key, kind), spec, *inputs)
                if key.accelerator is not None or program.plan.placement.platform == mesh_platform(self.mesh):
                    return traced.lower()
                return traced.lower(lowering_platforms=(program.plan.placement.platform,))

    def compile(self, kind: str, shape: tuple[int, ...], key: ProgramKey) -> jax.stages.Compiled:
        """``kind`` compiled for an input shape, on first use (then kept until `drop` or `clear`).

        Other threads asking for the same executable meanwhile wait for this
        one; it is kept only once compiled.
        """
        with self.lock:
            program = self.program(key)
            if (kind, shape) not in program.executables:
                lowered = self.lower(kind, shape, key)
                # A compile-only device's executable cannot be read back from JAX's persistent cache.
                cache = _no_compile_cache() if key.accelerator is not None else contextlib.nullcontext()
                with cache:
                    program.executables[kind, shape] = lowered.compile(compiler_options=self.compiler_options(key))
            return program.executables[kind, shape]

    def compiler_options(self, key: ProgramKey) -> dict[str, Any] | None:
        """The XLA options ``key``'s programs compile with: the plan's, and a TPU's HBM limit (named or attached)."""
        program = self.program(key)
        options = dict(compiler_options(program.plan) or {})
        if key.accelerator is not None:
            options.update(budget.compiler_options(key.accelerator) or {})
        elif program.plan.placement.platform == mesh_platform(self.mesh_of(key)):  # runs here, not only lowered
            options.update(budget.attached_compiler_options(self.mesh_of(key)) or {})
        return options or None

    def compiled(self, kind: str, shape: tuple[int, ...], key: ProgramKey) -> jax.stages.Compiled | None:
        """The executable `compile` keeps for ``kind`` and ``shape``, or None (compiles nothing)."""
        return self.program(key).executables.get((kind, shape))

    def keep(self, kind: str, shape: tuple[int, ...], key: ProgramKey, executable: jax.stages.Compiled) -> None:
        """Puts back an executable `drop` removed."""
        with self.lock:
            self.program(key).executables[kind, shape] = executable

    def drop(self, kind: str, shape: tuple[int, ...], key: ProgramKey) -> None:
        """Forgets the executable of ``kind`` for ``shape`` (it will not run)."""
        with self.lock:
            self.program(key).executables.pop((kind, shape), None)

    def reset(self) -> None:
        """Starts every program afresh but the own one's patched module (tiling switches changed)."""
        with self.lock:
            own = self.own
            self._programs = {ProgramKey(): Program(own.module, own.plan, self.mesh)}

    def clear(self) -> None:
        """Drops every executable and every copy of the weights: on other meshes, and transposed (`WeightLayout`)."""
        with self.lock:
            for program in self._programs.values():
                program.executables.clear()
            self._copies.clear()
            self._laid_out.clear()

