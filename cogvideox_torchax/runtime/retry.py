"""Running a planned program, and once more on the next smaller plan when the device runs out of memory.

A plan is chosen from compiled bytes against what the device says it has
free (``max_memory="auto"``); if the device then runs out anyway, the
library plans again below the failed plan and runs once more, with a
`PlanReplacedWarning` saying so. Under jax.distributed the processes must
agree before retrying (one program runs on all of them): the command lines
do that (`cogvideox_torchax.cli`), so the library retries in one process only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax

from cogvideox_torchax.runtime import budget


class PlanReplacedWarning(ResourceWarning):
    """A planned program ran out of memory and the next smaller plan replaced it."""


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is XLA's RESOURCE_EXHAUSTED / out of memory, or a MemoryError."""
    if isinstance(e, MemoryError):
        return True
    if isinstance(e, ValueError):
        return False
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def retry_out_of_memory(planner: Any, kind: str, shape: tuple[int, ...], run: Callable[[], Any]) -> Any:
    """``run()`` (which runs ``shape``'s planned ``kind``), finished on the device; once more on a smaller plan.

    Only under ``max_memory="auto"``, in one process, and when ``shape`` has
    a plan: otherwise the error stands, as it does when no smaller plan
    exists or the second run fails too.
    """
    if not planner.auto or not planner.retries or jax.process_count() > 1:
        return run()
    try:
        return jax.block_until_ready(run())  # an execution's out-of-memory surfaces here
    except Exception as e:
        failed = planner.planned(kind, shape)
        if not is_out_of_memory(e) or failed is None:
            raise
        try:
            smaller = planner.smaller(kind, shape)
        except budget.MemoryBudgetError:
            raise e from None
    warnings.warn(
        f"out of memory running the {failed.name} program for {shape}; retrying once with the "
        f"{smaller.name} plan ({budget.human(smaller.bytes)})",
        PlanReplacedWarning,
        stacklevel=3,
    )
    return run()
