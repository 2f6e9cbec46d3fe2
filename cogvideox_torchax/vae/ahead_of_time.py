"""Lowering, compiling and planning a shape before anything runs: `TorchaxVAE`'s ahead-of-time surface.

`AheadOfTime` is a mixin over the class's ``programs`` (`ProgramCache`),
``planner`` (`Planner`), ``check_latents`` and ``check_video``: what a
program would be (lowered, compiled, for the attached devices or a named
accelerator), which memory plan a shape gets, and the compiled programs
kept per shape.
"""

from __future__ import annotations

from typing import Any

import jax

from cogvideox_torchax.memory import budget
from cogvideox_torchax.memory.planner import key_of
from cogvideox_torchax.vae import stream
from cogvideox_torchax.vae.program_cache import ProgramKey


class AheadOfTime:
    """Programs and plans for a shape, lowered, compiled or planned without running them; the compiled ones kept."""

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
        return self._lower("decode", shape, platform, target, mesh)

    def lower_encode(
        self, shape: tuple[int, ...], *, platform: str | None = None, target: str | None = None, mesh: Any = None
    ) -> jax.stages.Lowered:
        """Traces and lowers the encode for a video shape without running it (arguments as in `lower_decode`)."""
        return self._lower("encode", shape, platform, target, mesh)

    def _lower(self, kind: str, shape, platform: str | None, target: str | None, mesh: Any) -> jax.stages.Lowered:
        shape = tuple(shape)
        (self.check_video if kind == "encode" else self.check_latents)(shape)
        return self.programs.lower(kind, shape, (ProgramKey.for_target(target, mesh) if target else self.programs.platform_key(platform)))

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
        """The executable of ``kind`` (``"decode"``, ``"frames"``, ``"encode"``) that `memory_plan` chose for ``shape``."""
        shape = tuple(shape)
        (self.check_video if kind == "encode" else self.check_latents)(shape)
        with self.programs.lock:  # the plan and its executable together, as no other thread changes them
            return self.programs.compile(
                kind, shape, key_of(self.memory_plan(shape, kind=kind, target=target, mesh=mesh))
            )

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
        (self.check_video if kind == "encode" else self.check_latents)(tuple(shape))
        return self.planner.measure_all(kind, tuple(shape))

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
        why = stream.why_not_streamed(self.module, shape, self.programs)
        if why:
            raise ValueError(f"decode_stream: {why}")
        first, step = stream.executables(self.programs, shape, output)
        total, _ = self.memory_budget()
        return budget.MemoryPlan("streamed", None, stream.streamed_bytes(first, step, in_flight), budget.usable(total))

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
        with self.programs.lock:
            self.programs.reset()
            self.planner.forget()

    def compiled_shapes(self, kind: str = "decode") -> list[tuple[int, ...]]:
        """The input shapes that have a compiled ``kind`` (``"decode"`` or ``"encode"``) program, oldest first."""
        return [key[1] for key in self.planner.plans() if len(key) == 2 and key[0] == kind]

    def clear_compiled(self, *, jax_caches: bool = False) -> None:
        """Drops this VAE's compiled programs (one is kept per input shape, encode and decode).

        Each shape keeps its executable in host memory until this is called;
        copies of the weights on other meshes go too. ``jax_caches`` also
        calls `jax.clear_caches()` (every jitted function in the process
        recompiles on its next call).
        """
        with self.programs.lock:
            self.programs.clear()
            self.planner.forget()
        if jax_caches:
            jax.clear_caches()
