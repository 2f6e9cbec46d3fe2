"""The suite's XLA:CPU programs get LLVM's -O0 machine code: the same programs, compiled in half the time.

Much of the suite's time is XLA:CPU compiling small programs, most of it
LLVM optimizing the machine code of XLA's fused loops.
`--xla_backend_optimization_level` sets only that: XLA's own passes (what
the tests read from compiled programs) run alike, so the optimized HLO is
the one users get, and fp32 outputs move only in the last bits. The GPU
and TPU compilers are not affected. Figures: docs/testing.md.

What users run, XLA's default machine code, is still checked against
upstream: `tests/test_suite_processes.py` runs the tiny parity and
exactness tests of every family in a process of its own without this flag.
A run whose ``XLA_FLAGS`` sets the level itself keeps it, and one with
`KEEP_DEFAULT` set to ``1`` compiles as a user's process does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

FLAG = "--xla_backend_optimization_level=0"
KEEP_DEFAULT = "COGVIDEOX_TORCHAX_TEST_DEFAULT_CODEGEN"


def apply_fast_cpu_codegen() -> None:
    """Sets ``XLA_FLAGS`` to `fast_cpu_flags` for this process and those it starts, where it says to.

    Must run before JAX starts a backend: XLA reads its flags once, then.

    Raises:
        RuntimeError: a backend already started, so the flag would silently not apply.
    """
    flags = fast_cpu_flags(os.environ)
    if flags is None:
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("a JAX backend started before the suite set XLA_FLAGS; nothing may run JAX at import")
    os.environ["XLA_FLAGS"] = flags


def fast_cpu_flags(environ: Mapping[str, str]) -> str | None:
    """``XLA_FLAGS`` with `FLAG` added, or None where the run chose its level (in ``XLA_FLAGS``, or `KEEP_DEFAULT`)."""
    flags = environ.get("XLA_FLAGS", "")
    if environ.get(KEEP_DEFAULT) == "1" or "--xla_backend_optimization_level" in flags:
        return None
    return with_flags(FLAG, flags=flags)


def with_flags(*extra: str, flags: str | None = None) -> str:
    """``XLA_FLAGS`` with ``extra`` appended: a child process that needs its own flags keeps the suite's."""
    current = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    return " ".join([*current.split(), *extra])


def default_codegen_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A child process's environment that compiles as a user's does: `FLAG` removed, `KEEP_DEFAULT` set."""
    env = dict(environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != FLAG)
    env[KEEP_DEFAULT] = "1"
    return env
