"""Lowering, compiling and planning a shape before anything runs, as functions of a `TorchaxVAE`.

What a program would be (lowered, compiled, for the attached devices or a
named accelerator), the executable a shape's memory plan chose, and
dropping the compiled programs kept per shape. The VAE's ``lower_*``,
``compile_*``, `planned_executable`, `memory_candidates`, `reset_programs`,
`compiled_shapes` and `clear_compiled` call these; they read its
``programs`` (`ProgramCache`) and ``planner`` (`Planner`) when they run, as
``to(dtype)`` may swap both.
"""

from __future__ import annotations

from typing import Any

import jax

from cogvideox_torchax.memory import budget
from cogvideox_torchax.memory.planner import Planner, key_of
from cogvideox_torchax.vae.program_cache import ProgramKey


def check(vae: Any, kind: str, shape: tuple[int, ...]) -> None:
    """Raises ValueError unless ``shape`` is the VAE's video (``kind`` ``"encode"``) or latents (otherwise)."""
    (vae.check_video if kind == "encode" else vae.check_latents)(shape)


def lower(
    vae: Any,
    kind: str,
    shape: tuple[int, ...],
    platform: str | None = None,
    target: str | None = None,
    mesh: Any = None,
) -> jax.stages.Lowered:
    """The ``kind`` (``"decode"`` or ``"encode"``) program for ``shape``, lowered (`TorchaxVAE.lower_decode`)."""
    shape = tuple(shape)
    check(vae, kind, shape)
    key = ProgramKey.for_target(target, mesh) if target else vae.programs.platform_key(platform)
    return vae.programs.lower(kind, shape, key)


def planned_executable(
    vae: Any, kind: str, shape: tuple[int, ...], target: str | None = None, mesh: Any = None
) -> jax.stages.Compiled:
    """The executable of ``kind`` that the VAE's `memory_plan` chose for ``shape``, compiled on first use."""
    shape = tuple(shape)
    check(vae, kind, shape)
    with vae.programs.lock:  # the plan and its executable together, as no other thread changes them
        return vae.programs.compile(kind, shape, key_of(vae.memory_plan(shape, kind=kind, target=target, mesh=mesh)))


def memory_candidates(vae: Any, kind: str, shape: tuple[int, ...]) -> list[budget.MemoryPlan]:
    """Every candidate plan of ``kind`` for ``shape`` with its compiled bytes, in order (`Planner.measure_all`)."""
    check(vae, kind, tuple(shape))
    return vae.planner.measure_all(kind, tuple(shape))


def compiled_shapes(planner: Planner, kind: str) -> list[tuple[int, ...]]:
    """The input shapes ``planner`` has a ``kind`` plan (so a compiled program) for, oldest first."""
    return [key[1] for key in planner.plans() if len(key) == 2 and key[0] == kind]


def reset_programs(vae: Any) -> None:
    """Starts the VAE's programs afresh and forgets every plan (`TorchaxVAE.reset_programs`)."""
    with vae.programs.lock:
        vae.programs.reset()
        vae.planner.forget()


def clear_compiled(vae: Any, jax_caches: bool = False) -> None:
    """Drops the VAE's compiled programs and plans; ``jax_caches`` also clears JAX's (`TorchaxVAE.clear_compiled`)."""
    with vae.programs.lock:
        vae.programs.clear()
        vae.planner.forget()
    if jax_caches:
        jax.clear_caches()
