"""Several processes of a jax.distributed run agreeing after each step: all go on, or all leave with one code."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from cogvideox_torchax.cli import errors, options
from cogvideox_torchax.parallel import distributed  # imports no framework: JAX only once a cluster starts


def peer_failed(codes: list[int], what: str, own: BaseException | None = None) -> errors.PeerFailed:
    code = errors.agreed_code(codes)
    i = codes.index(code)
    return errors.PeerFailed(code, f"process {i} of the jax.distributed run failed {what} (exit {code}); see its log", own)


def gather_codes(code: int) -> list[int]:
    if process_count() == 1:
        return [code]
    return distributed.gather_ints(code)


def start_distributed(joins: options.DistributedOptions) -> None:
    """Joins the cluster the options name, if any."""
    if not joins.joins:
        return
    explicit = [joins.coordinator, joins.num_processes, joins.process_id]
    try:
        if joins.distributed and all(v is None for v in explicit):
            distributed.initialize_distributed(timeout_s=joins.timeout_s)
        else:
            distributed.initialize_distributed(*explicit, timeout_s=joins.timeout_s)
    except distributed.DistributedError as e:
        raise errors.UsageError(str(e)) from e


def process_count() -> int:
    # Asks JAX only when jax.distributed has been started (importing JAX is
    # slow, and a one-process run need not).
    if "jax" not in sys.modules:
        return 1
    return distributed.process_count() if distributed.is_initialized() else 1


def is_primary() -> bool:
    """Whether this process reads, writes and prints (always, unless a non-zero jax.distributed process)."""
    if process_count() == 1:
        return True
    return distributed.is_primary()


@contextlib.contextmanager
def together(what: str) -> Iterator[None]:
    """A step after which every process of a jax.distributed run goes on, or every one fails with one code.

    Inside, code may fail on one process only (process 0's reading, a host's
    model load); each process then reports its exit code to the others, and
    every process leaves with the code of `errors.agreed_code` (an interrupt
    anywhere, else the first failing process's): its own exception if the
    codes match, else `errors.PeerFailed`. Collectives (gathers, shares) belong
    outside: a process that failed early would meet the others' gather with
    its report. With one process it does nothing.
    """
    if process_count() == 1:
        yield
        return
    try:
        yield
    except BaseException as e:
        settle(None, e, what)
        raise  # not reached: an exception's code is never errors.EXIT_OK
    settle(None, None, what)


def attempt(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except BaseException as e:  # reported to the other processes before anyone leaves
        return None, e


def settle(result: Any, error: BaseException | None, what: str) -> Any:
    """``result`` if every process succeeded, else raises with the agreed code (a collective when distributed)."""
    codes = gather_codes(errors.EXIT_OK if error is None else errors.exit_code(error))
    if errors.agreed_code(codes) == errors.EXIT_OK:
        return result
    raise_agreed(codes, error, what)


def raise_agreed(codes: list[int], error: BaseException | None, what: str) -> None:
    """Raises this process's own ``error`` if its code is the agreed one, else `errors.PeerFailed` with that code."""
    if error is not None and errors.exit_code(error) == errors.agreed_code(codes):
        raise error
    raise peer_failed(codes, what, own=error)


@contextlib.contextmanager
def stdout_kept_for_results() -> Iterator[None]:
    # gloo writes its connection notes to the process's stdout (fd 1), which
    # would break --json: fd 1 goes to stderr, Python's stdout to the old fd 1.
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(2, 1)
    previous = sys.stdout
    sys.stdout = open(kept, "w", buffering=1, closefd=True)  # noqa: SIM115 - closed below
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(kept, 1)
        sys.stdout.close()
        sys.stdout = previous
