"""Out of memory in a command: one line naming the shape, plan and ``--max-memory`` that fits; the retry's agreed steps."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from cogvideox_torchax.cli import agreement, errors


def is_out_of_memory(e: BaseException) -> bool:
    """XLA's RESOURCE_EXHAUSTED / out of memory, or a MemoryError (`retry.is_out_of_memory`).

    Not bad input, and not the command's own errors: one already told (`errors.OutOfMemory`, a peer's
    agreed failure) passes any outer guard as it is.
    """
    from cogvideox_torchax.memory.retry import is_out_of_memory  # imports JAX: not before the options are checked

    return not isinstance(e, (errors.UsageError, errors.OutOfMemory, errors.PeerFailed)) and is_out_of_memory(e)


_ASKED = re.compile(r"allocat\w*\s+([\d.]+\s*[KMGT]?i?B|\d+\s*bytes)", re.I)


@contextlib.contextmanager
def out_of_memory_as_exit_3(what: str, shape: tuple[int, ...], vae=None, kind: str | None = None) -> Iterator[None]:
    """Turns XLA's RESOURCE_EXHAUSTED / out-of-memory errors (and MemoryError) inside the block into `errors.OutOfMemory`.

    The message names the shape, the bytes asked (from XLA's message) and
    the plan's bytes and budget; with the program ``kind`` (``"decode"``,
    ``"frames"``, ``"encode"``) also the ``--max-memory`` that would choose
    the next smaller plan, or that none exists.
    """
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        raise errors.OutOfMemory(line(e, what, shape, vae, kind)) from e


def line(e: BaseException, what: str, shape: tuple[int, ...], vae=None, kind: str | None = None) -> str:
    """The one line of an out-of-memory error: the shape, the bytes asked, the plan, the ``--max-memory`` that fits."""
    from cogvideox_torchax.memory import budget  # imports JAX: not before the options are checked

    shape = tuple(int(v) for v in shape)
    where = f" ({vae.options.dtype}, mesh {dict(vae.mesh.shape)})" if vae is not None else ""
    asked = _ASKED.search(str(e))
    first = " ".join(str(e).split("\n")[0].split())[:200] or type(e).__name__
    line = f"out of memory {what} shape {shape}{where}: " + (f"asked {asked.group(1)}" if asked else first)
    kinds = [kind] if kind else ["decode", "frames", "encode"]
    plans = [] if vae is None else [vae.planned(shape, kind=k) for k in kinds]
    plan = next((p for p in plans if p is not None), None)
    if plan is not None:
        line += f"; the plan ({plan.name}) compiled to {budget.human(plan.bytes)} per device"
        line += f" of {budget.human(plan.budget)} usable" if plan.budget else ""
        if kind is not None:  # asked for the hint: plans the next one (this run is over)
            try:
                # Planned, not chosen: a many-latents run goes on with its plans as they were.
                smaller = vae.next_plan(shape, kind=kind, choose=False)
            except budget.MemoryBudgetError:
                return line + "; no smaller plan exists: try --dtype bfloat16 or a mesh with more devices on tp"
            except Exception:  # the hint is a courtesy; the line stands without it
                smaller = None
            if smaller is not None:
                flag = _size_flag(budget.budget_for(smaller.bytes))
                return line + f"; --max-memory {flag} would run the {smaller.name} plan ({budget.human(smaller.bytes)})"
    return line + "; try a --max-memory below what the device really has free (tiling follows), --dtype bfloat16, or a larger --mesh"


def _size_flag(n: float) -> str:
    """A ``--max-memory`` value of at least ``n`` bytes, rounded up: ``12.35GiB`` or ``831MiB``."""
    if n >= 2**30:
        return f"{math.ceil(n / 2**30 * 100) / 100:.2f}GiB"
    return f"{math.ceil(n / 2**20)}MiB"


class AgreedSteps:
    """The library's retry steps (`retry.Steps`) as a command takes them: every process together, errors as exit codes.

    Under jax.distributed every process runs each step (the run, the new
    plan, the second run) and all agree on their exit codes after it: if
    any ran out of memory and none failed otherwise, all retry on the same
    next plan; otherwise all leave with one code. An out-of-memory error
    becomes `errors.OutOfMemory`, its line naming the shape and plan (and,
    when nothing follows, the ``--max-memory`` that would fit); the
    replaced plan is one warning line.
    """

    def __init__(self, vae, shape: tuple[int, ...], kind: str, what: str, *, quiet: bool):
        self.vae, self.shape, self.kind, self.what, self.quiet = vae, tuple(shape), kind, what, quiet
        self.codes: list[int] = []

    def run(self, step: str, fn: Callable[[], Any]) -> Any:
        if step == "plan":
            guard = out_of_memory_as_exit_3("planning again for", self.shape)
        else:  # the hint plans the next plan: only once no retry follows
            guard = out_of_memory_as_exit_3(self.what, self.shape, self.vae, self.kind if step == "last" else None)

        def guarded() -> Any:
            with guard:
                return fn()

        self.codes = []
        result, error = agreement.attempt(guarded)
        self.codes = agreement.gather_codes(errors.EXIT_OK if error is None else errors.exit_code(error))
        if errors.agreed_code(self.codes) == errors.EXIT_OK:
            return result
        agreement.raise_agreed(self.codes, error, self.what)

    def out_of_memory(self, e: BaseException) -> bool:
        # Every process's code, not only the agreed one: one that failed
        # otherwise keeps them all from retrying.
        # (None gathered, e.g. the exchange itself failed: no retry.)
        return errors.EXIT_OUT_OF_MEMORY in self.codes and set(self.codes) <= {errors.EXIT_OK, errors.EXIT_OUT_OF_MEMORY}

    def replaced(self, failed, smaller, shape: tuple[int, ...]) -> None:
        from cogvideox_torchax.memory.retry import replaced_line  # imports JAX, loaded by now

        errors.warn_once(replaced_line(failed, smaller, shape), self.quiet)


@contextlib.contextmanager
def agreed_retry(vae, what: str, *, quiet: bool) -> Iterator[None]:
    """Within: the VAE's own out-of-memory retry (`retry.retry_out_of_memory`) takes `AgreedSteps`.

    With ``--max-memory auto``, a call of the VAE that runs out of memory
    is tried once more on the next smaller plan (a warning line says so)
    before the command gives up with exit code 3; every process takes each
    step together. ``what``: the work, as the out-of-memory line names it.
    """
    from cogvideox_torchax.memory import retry  # imports JAX, loaded by now

    with retry.taken_by(lambda kind, shape: AgreedSteps(vae, shape, kind, what, quiet=quiet)):
        yield


def nonfinite_cause(vae, what: str, input_largest: float) -> str:
    """Why a decode or encode result holds NaN/Inf: NaN weights, or an input out of range for the dtype."""
    import jax.numpy as jnp  # loaded with the model by now

    for key, w in vae.weights.items():
        if not bool(jnp.isfinite(w).all()):
            return f"the model's weight {key!r} holds NaN or Inf; nothing was written"
    # float16's range (largest 65504) is the one an activation can leave
    # while the input is well inside it; bfloat16 and float32 reach 3.4e38.
    hint = " (float16 overflows above 65504: try --dtype bfloat16 or float32)" if vae.options.dtype == "float16" else ""
    return (
        f"the {what} produced NaN or Inf: its input (largest |value| {input_largest:.3g}) is out of range for "
        f"{vae.options.dtype} computation{hint}; nothing was written"
    )


def check_finite(result, vae, what: str, input_largest: float) -> None:
    """Raises `errors.UsageError` (exit 2, nothing written) when ``result`` holds NaN or Inf, naming the cause."""
    if not np.isfinite(result).all():
        raise errors.UsageError(nonfinite_cause(vae, what, input_largest))
