"""Running a planned program, and once more on the next smaller plan when the device runs out of memory.

A plan is chosen from compiled bytes against what the device says it has
free (``max_memory="auto"``); if the device then runs out anyway, the
library plans again below the failed plan and runs once more. This module
holds that rule once, and every decode and encode of a VAE runs through it
(`cogvideox_torchax.vae.calls`): nothing else retries. How each step runs
and how the replacement is told is a `Steps`: `Alone` (the default: this
process, a `PlanReplacedWarning`), or, inside `taken_by`, the command
lines' agreed steps, which every process of a jax.distributed run takes
together (`cogvideox_torchax.cli.out_of_memory`).
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax

from cogvideox_torchax.memory import budget

# The steps the retry of a call takes in this context (`taken_by`), made for the call's kind and shape.
_STEPS: contextvars.ContextVar[Callable[[str, tuple[int, ...]], Steps] | None] = contextvars.ContextVar(
    "retry_steps", default=None)


class PlanReplacedWarning(RuntimeWarning):
    """A planned program ran out of memory and the next smaller plan replaced it."""


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is XLA's RESOURCE_EXHAUSTED / out of memory, or a MemoryError."""
    if isinstance(e, MemoryError):
        return True
    if isinstance(e, ValueError):
        return False
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


class Steps(Protocol):
    """How `retry_out_of_memory` runs its steps and tells of a replaced plan."""

    def run(self, step: str, fn: Callable[[], Any]) -> Any:
        """``fn()``'s result, or raises what failed.

        ``step``: ``"first"`` (a retry may follow), ``"plan"`` (choosing
        the smaller plan) or ``"last"`` (nothing follows). A run's ``fn``
        returns its result finished on the device, where an out-of-memory
        error surfaces (the first step's always; the last's where the steps
        are given).
        """

    def out_of_memory(self, e: BaseException) -> bool:
        """Whether the failure ``e`` of the first step may be retried on a smaller plan."""

    def replaced(self, failed: budget.MemoryPlan | None, smaller: budget.MemoryPlan, shape: tuple[int, ...]) -> None:
        """Tells that ``smaller`` replaces ``failed`` for ``shape`` (before the last step)."""


def replaced_line(failed: budget.MemoryPlan | None, smaller: budget.MemoryPlan, shape: tuple[int, ...]) -> str:
    """What a retry says of itself: the failed plan, the shape, and the plan that runs instead."""
    return (
        f"out of memory running the {failed.name if failed else 'planned'} program for {shape}; retrying once with the "
        f"{smaller.name} plan ({budget.human(smaller.bytes)})"
    )


class Alone:
    """One process's steps, each run as it is; a replaced plan is a `PlanReplacedWarning`."""

    def run(self, step: str, fn: Callable[[], Any]) -> Any:
        return fn()

    def out_of_memory(self, e: BaseException) -> bool:
        return is_out_of_memory(e)

    def replaced(self, failed: budget.MemoryPlan | None, smaller: budget.MemoryPlan, shape: tuple[int, ...]) -> None:
        warnings.warn(replaced_line(failed, smaller, shape), PlanReplacedWarning, stacklevel=5)


@contextlib.contextmanager
def taken_by(make: Callable[[str, tuple[int, ...]], Steps]) -> Iterator[None]:
    """Within: the retry of every call (`retry_out_of_memory`) takes the steps ``make(kind, shape)`` gives.

    How a command has every process of a jax.distributed run take each
    step together, while the retry itself stays the VAE's.
    """
    token = _STEPS.set(make)
    try:
        yield
    finally:
        _STEPS.reset(token)


def retry_out_of_memory(
    planner: Any, kind: str, shape: tuple[int, ...], run: Callable[[], Any], steps: Steps | None = None
) -> Any:
    """``run()`` (which runs ``shape``'s planned ``kind``); once more on a smaller plan if it ran out of memory.

    Only under ``max_memory="auto"`` and, in one process, when ``shape``
    has a plan: otherwise the error stands, as it does when no smaller plan
    exists or the second run fails too. ``steps``: how the steps are taken;
    by default those `taken_by` gives in this context, else `Alone`, under
    which nothing is retried under jax.distributed (the processes could not
    agree on it). The first run, and the last where steps are given, are
    waited for on the device (where their out-of-memory error surfaces).
    """
    shape = tuple(shape)
    if steps is None and (make := _STEPS.get()) is not None:
        steps = make(kind, shape)
    return _retry(planner, kind, shape, run, steps)


def _retry(planner: Any, kind: str, shape: tuple[int, ...], run: Callable[[], Any], steps: Steps | None) -> Any:
    alone = steps is None

    def finished() -> Any:
        return jax.block_until_ready(run())

    if not planner.auto or (alone and jax.process_count() > 1):
        return run() if alone else steps.run("last", finished)
    steps = steps or Alone()
    try:
        return steps.run("first", finished)
    except Exception as e:
        failed = planner.planned(kind, shape)
        # No plan at all (none fits): planning again finds none either. Under
        # jax.distributed the processes still take the planning step together.
        if not steps.out_of_memory(e) or (failed is None and jax.process_count() == 1):
            raise
        try:
            smaller = steps.run("plan", lambda: planner.smaller(kind, shape))
        except Exception as planning:
            if alone and not isinstance(planning, budget.MemoryBudgetError):
                raise  # planning itself broke
            # No smaller plan (or, agreed among processes, planning failed):
            # the run's failure stands, with its own cause.
            raise e from e.__cause__
    steps.replaced(failed, smaller, shape)
    return steps.run("last", run if alone else finished)
