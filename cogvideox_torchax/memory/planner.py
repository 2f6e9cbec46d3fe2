"""The memory planner: which candidate plan runs a shape, chosen from compiled bytes before anything runs.

`choose` is the rule, a pure function over candidates and what each needs;
`Planner` feeds it the candidates of a VAE (compiled on demand through its
`ProgramCache`) and the budget (``max_memory``, or ``"auto"``: the device's
capacity), and remembers each shape's plan. Budgets, candidates and the
safety margin are `cogvideox_torchax.memory.budget`'s.

Threads: a `Planner` plans and changes plans under its programs' lock
(`ProgramCache.lock`), so a shape is planned once while other threads wait;
`runnable` and the read-only queries take no lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax

from cogvideox_torchax.memory import budget
from cogvideox_torchax.memory.budget import Candidate, MemoryBudgetError, MemoryPlan
from cogvideox_torchax.parallel import distributed
from cogvideox_torchax.platforms import accelerators
from cogvideox_torchax.vae.program_cache import ProgramCache, ProgramKey


class Choice(NamedTuple):
    """What `choose` found: the candidate that fits (or None) and every ``(candidate, bytes)`` it measured."""

    chosen: Candidate | None
    tried: tuple[tuple[Candidate, int], ...]

    @property
    def need(self) -> int | None:
        return self.tried[-1][1] if self.chosen is not None else None


def choose(candidates: Iterable[Candidate], need: Callable[[Candidate], int], usable: int) -> Choice:
    """The planner's rule: the first candidate whose ``need`` fits ``usable`` bytes.

    Anything with a ``tiling`` attribute is a candidate (the bench passes
    already-measured `MemoryPlan` s with ``need=lambda p: p.bytes``).

    Candidates come in order of expected speed. Once a tiled candidate needs
    no less than the tiled one before it (blending and per-tile work
    dominate), smaller tiles are not measured; candidates without tiling
    (wider meshes) still are.
    """
    tried: list[tuple[Candidate, int]] = []
    previous = None
    tiles_done = False
    for c in candidates:
        if tiles_done and c.tiling is not None:
            continue
        n = need(c)
        tried.append((c, n))
        if n <= usable:
            return Choice(c, tuple(tried))
        if c.tiling is not None and previous is not None and n >= previous:
            tiles_done = True
        previous = n if c.tiling is not None else None
    return Choice(None, tuple(tried))


def allowance(target: str | None) -> int:
    """What a program compiled for named accelerator ``target`` needs on it beyond its compiled bytes (None: 0).

    A compile-only GPU build does not autotune, so its `memory_analysis()`
    lacks the cuDNN workspaces the device picks
    (`accelerators.CUDA_AUTOTUNE_ALLOWANCE`); a compile on the device itself
    counts them.
    """
    return 0 if target is None else accelerators.get(target).autotune_allowance


def key_of(plan: MemoryPlan | Candidate) -> ProgramKey:
    """The program a plan or candidate runs."""
    return ProgramKey.of(plan.target, plan.tiling, plan.mesh)


class Planner:
    """Each shape's `MemoryPlan` for one VAE's programs, under one ``max_memory``."""

    def __init__(self, programs: ProgramCache, max_memory: str | int | None):
        self.programs = programs
        self.max_memory = budget.parse_memory(max_memory)
        self._plans: dict[tuple, MemoryPlan] = {}
        self._capacity: tuple[int, str] | None = None

    @property
    def auto(self) -> bool:
        """Whether the budget is the device's capacity (``max_memory="auto"``): a plan may then fail to run."""
        return self.max_memory is None

    def candidates(self, kind: str, shape: tuple[int, ...], target: str | None = None,
                   mesh: tuple[int, int] | None = None) -> list[Candidate]:
        """Candidates in order of expected speed: whole, tiled with growing tile counts, wider ``tp`` meshes."""
        module, family = self.programs.own.module, self.programs.family
        scale = family.spatial_scale(module.config)
        frame = shape[-2:] if kind != "encode" else tuple(-(-n // scale) for n in shape[-2:])
        first = "tiled as set" if module.use_tiling else "whole"
        tiled = [Candidate(name, kw, None) for name, kw in family.tiled_candidates(module, frame, budget.TILE_COUNTS)]
        if target is not None:  # a named accelerator: its devices, its mesh named
            wider = budget.tp_candidates(mesh, accelerators.get(target).devices, first)
            return [Candidate(first, None, mesh, target), *(c._replace(mesh=mesh, target=target) for c in tiled),
                    *(c._replace(target=target) for c in wider)]
        # Other meshes only within one process: under jax.distributed a mesh uses every device already.
        devices = len(self.programs.platform_devices()) if jax.process_count() == 1 else 0
        own = self.programs.mesh
        return [Candidate(first, None, None), *tiled,
                *budget.tp_candidates((own.shape["dp"], own.shape["tp"]), devices, first)]

    def need(self, kind: str, shape: tuple[int, ...], c: Candidate) -> int:
        """A candidate's bytes per device: compiled (or named by a compiler that refused it), plus `allowance`."""
        try:
            n = budget.compiled_bytes(self.programs.compile(kind, shape, key_of(c)))
        except Exception as e:  # the TPU compiler refuses programs above its HBM, naming their size
            n = budget.refused_bytes(e)
            if n is None:
                raise
        return n + allowance(c.target)

    def planned(self, kind: str, shape: tuple[int, ...]) -> MemoryPlan | None:
        return self._plans.get((kind, shape))

    def runnable(self, kind: str, shape: tuple[int, ...]) -> tuple[jax.stages.Compiled, dict, Any] | None:
        """The planned executable of ``kind`` for ``shape``, its weights and mesh, if all are built; else None.

        Takes no lock and builds nothing (`ProgramCache.ready`): a thread runs
        a compiled shape while another compiles.
        """
        plan = self._plans.get((kind, shape))
        return None if plan is None else self.programs.ready(kind, shape, key_of(plan))

    def executable(self, kind: str, shape: tuple[int, ...]) -> tuple[jax.stages.Compiled, dict, Any]:
        """The planned executable of ``kind`` for ``shape``, its weights and mesh, planned and compiled on first use."""
        found = self.runnable(kind, shape)
        if found is not None:
            return found
        with self.programs.lock:
            key = key_of(self.plan(kind, shape))
            executable = self.programs.compile(kind, shape, key)
            return executable, self.programs.weights_for(key, kind), self.programs.mesh_of(key)

    def plans(self) -> dict[tuple, MemoryPlan]:
        """Every plan made, by ``(kind, shape)`` (``(kind, shape, target, dp, tp)`` for a named accelerator)."""
        return dict(self._plans)

    def plan(self, kind: str, shape: tuple[int, ...], target: str | None = None, mesh: Any = None) -> MemoryPlan:
        """How a shape runs within the memory budget, compiling candidates (running nothing) on first use.

        Candidates in order of expected speed: the whole program (with the
        VAE's own tiling switches), then upstream's tiling with growing
        tile counts (`Family.tiled_candidates`), then, when the mesh leaves
        devices of its platform unused (one process), the whole program on
        meshes with more devices on ``tp`` (`budget.tp_candidates`; the
        weights are copied there when chosen). The first whose compiled
        temporaries + arguments + outputs fit the budget, less
        `budget.SAFETY_MARGIN`, is the plan (`choose`); `TorchaxVAE.decode`
        and `encode` run it. The budget is ``max_memory`` (``"auto"``: the
        device's capacity, `budget.device_capacity`; then a plan that still
        runs out of memory is replaced once by the next smaller one).

        Args:
            shape: latents ``(B, C, T, H, W)`` for ``kind="decode"``, a video
                ``(B, C, F, H, W)`` for ``"encode"``.
            kind: ``"decode"``, ``"frames"`` or ``"encode"``.
            target: plan for this named accelerator instead (as
                `lower_decode` takes it): candidates compiled by its real
                compiler, each one's need its compiled bytes plus `allowance`
                (the target's autotuned cuDNN workspaces), the budget its
                per-device `accelerators.Accelerator.budget`
                (or ``max_memory`` when given), wider meshes up to its devices.
            mesh: with ``target``, the mesh over its devices (``"dp=1,tp=8"``;
                default all on ``tp``).

        Raises:
            MemoryBudgetError: no candidate fits; says what each needs.
        """
        on = None
        if target is not None:
            at = accelerators.target_mesh(target, mesh)
            on = (accelerators.get(target).name, at.shape["dp"], at.shape["tp"])
        key = (kind, shape) if on is None else (kind, shape, *on)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        with self.programs.lock:  # one thread plans a shape; the others wait for its plan
            if key not in self._plans:
                if on is not None:
                    acc = accelerators.get(on[0])
                    limit, source = (self.max_memory, "max_memory") if self.max_memory else (acc.budget, acc.name)
                else:
                    limit, source = self.budget()
                extra = allowance(on[0] if on else None)
                counted = f"; {budget.human(extra)} of autotuned cuDNN workspaces added to each" if extra else ""
                why = f"({source} {budget.human(limit)} less {budget.SAFETY_MARGIN:.0%} margin{counted})"
                self._plans[key] = self._plan(kind, shape, budget.usable(limit), why, on)
            return self._plans[key]

    def _plan(self, kind: str, shape: tuple[int, ...], usable: int, why: str, on: tuple | None) -> MemoryPlan:
        candidates = self.candidates(kind, shape, *((on[0], on[1:]) if on else ()))
        measured: list[Candidate] = []  # compiled by this call: dropped again if it fails

        def need(c: Candidate) -> int:
            new = self.programs.compiled(kind, shape, key_of(c)) is None
            n = self.need(kind, shape, c)
            if new:
                measured.append(c)
            return n

        try:
            choice = choose(candidates, need, usable)
        except BaseException:
            for c in measured:  # a failed plan keeps nothing
                self.programs.drop(kind, shape, key_of(c))
            raise
        for c, _ in choice.tried:  # not kept: they will not run here
            if c is not choice.chosen:
                self.programs.drop(kind, shape, key_of(c))
        if choice.chosen is None:
            what = "decode" if kind == "frames" else kind
            raise MemoryBudgetError(
                f"no plan for the {what} of {shape} fits {budget.human(usable)} per device {why}: "
                f"{'; '.join(f'{c.name} {budget.human(n)}' for c, n in choice.tried)}; "
                "give more memory (max_memory / --max-memory) or a mesh with more devices on tp"
            )
        c = choice.chosen
        return MemoryPlan(c.name, c.tiling, choice.need, usable, c.mesh, c.target, allowance(c.target))

    def budget(self) -> tuple[int, str]:
        """The per-device bytes plans must fit (before the safety margin), and where the figure comes from.

        Under jax.distributed the capacity is the least over every process,
        asked once: a collective, so every process must make its first call
        together (the command lines do, right after loading the model;
        otherwise the first plan does). One process asks at every plan (the
        host's free memory changes).
        """
        if self.max_memory is not None:
            return self.max_memory, "max_memory"
        if jax.process_count() == 1:
            return budget.device_capacity(self.programs.mesh)
        with self.programs.lock:
            if self._capacity is None:
                limit, source = budget.device_capacity(self.programs.mesh)
                limit = min(distributed.gather_ints(limit // 2**20)) * 2**20
                self._capacity = (limit, f"{source}, least of {jax.process_count()} processes")
            return self._capacity

    def smaller(self, kind: str, shape: tuple[int, ...], *, choose_it: bool = True) -> MemoryPlan:
        """The next plan below the shape's (which compiled within the budget and still ran out of memory).

        With ``choose_it=False`` the shape keeps its plan and executable;
        the smaller plan is only reported (an error message's hint).

        Raises:
            MemoryBudgetError: no smaller plan exists.
        """
        with self.programs.lock:
            return self._smaller(kind, shape, choose_it)

    def _smaller(self, kind: str, shape: tuple[int, ...], choose_it: bool) -> MemoryPlan:
        failed = self.plan(kind, shape)
        kept = self.programs.compiled(kind, shape, key_of(failed))
        del self._plans[kind, shape]
        why = f"(below the {failed.name} plan's {budget.human(failed.bytes)}, which ran out of memory)"
        try:
            smaller = self._plan(kind, shape, failed.bytes - 1, why, None)
        finally:
            if not choose_it:  # as it was: the plan and its executable
                self._plans[kind, shape] = failed
                if kept is not None:
                    self.programs.keep(kind, shape, key_of(failed), kept)
        if not choose_it:
            self.programs.drop(kind, shape, key_of(smaller))
            return smaller
        self._plans[kind, shape] = smaller
        self.programs.drop(kind, shape, key_of(failed))
        if failed.mesh is not None and all(p.mesh != failed.mesh for p in self._plans.values()):
            self.programs.forget_copy(failed.mesh)  # no plan runs there now: its weight copy goes
        return smaller

    def measure_all(self, kind: str, shape: tuple[int, ...]) -> list[MemoryPlan]:
        """Every candidate with its compiled bytes, in order (all compiled, none kept or run)."""
        plans = []
        with self.programs.lock:
            for c in self.candidates(kind, shape):
                n = budget.compiled_bytes(self.programs.compile(kind, shape, key_of(c)))
                self.programs.drop(kind, shape, key_of(c))
                plans.append(MemoryPlan(c.name, c.tiling, n, None, c.mesh))
        return plans

    def forget(self) -> None:
        """Forgets every plan (programs were reset or cleared)."""
        with self.programs.lock:
            self._plans.clear()
