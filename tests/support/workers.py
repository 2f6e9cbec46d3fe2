"""The suite over several pytest-xdist workers: how many, the tests that run alone, and one compile cache for all.

- Workers: ``-n auto`` is one per core, at most `MAX_WORKERS` (each holds
  JAX, torch and its compiled programs: 3 to 5 GB).
- Alone: a test that judges a time it measured (`conftest.SERIAL`) takes
  an exclusive lock that every other test takes shared, so no other
  worker's test runs beside it; a turnstile keeps a waiting one from being
  starved by the others' stream of shared locks.
- Threads: each worker's torch gets its share of the cores
  (`torch_threads`, through ``OMP_NUM_THREADS``, which the processes a
  test starts inherit), so that workers' eager references do not contend
  for the same cores; XLA keeps its own threads (limiting them was
  slower; docs/testing.md).
- One compile cache: every worker, and the processes the tests start that
  keep JAX's cache on, share JAX's persistent compilation cache in one
  folder per run, so a program one worker compiled the others load
  (a second stack has its own: the cache is keyed by the jax version). The
  folder is removed when the run ends, by the process that made it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

MAX_WORKERS = 4
# Set by the first process of a run (the controller under xdist) for the
# workers it starts: the folder of the run's locks and compile cache.
RUN_DIR = "COGVIDEOX_TORCHAX_TEST_RUN_DIR"


def auto_workers() -> int:
    """``-n auto``: one worker per core, at most `MAX_WORKERS`."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def torch_threads(workers: int, cores: int | None = None) -> int:
    """Threads for each worker's torch: an equal share of the cores, at least one."""
    return max(1, (cores or os.cpu_count() or 1) // max(1, workers))


def share_torch_threads(workers: int) -> None:
    """Sets ``OMP_NUM_THREADS`` to `torch_threads` for the workers to inherit, unless the run set it."""
    if workers >= 2 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(torch_threads(workers))


_made_here: list[Path] = []


def run_dir() -> Path:
    """The run's shared folder, made by the first process that asks (the controller, before the workers start)."""
    if not os.environ.get(RUN_DIR):
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="cogvideox-torchax-tests-")
        _made_here.append(Path(os.environ[RUN_DIR]))
    return Path(os.environ[RUN_DIR])


def remove_run_dir() -> None:
    """Removes the run's folder (about 80 MB of compiled programs) if this process made it: at the run's end."""
    for folder in _made_here:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(RUN_DIR) == str(folder):
            del os.environ[RUN_DIR]
    _made_here.clear()


def compile_cache_dir() -> Path:
    """The run's JAX compilation cache folder."""
    return run_dir() / "jax-cache"


@contextlib.contextmanager
def machine_share(alone: bool) -> Iterator[None]:
    """Holds the machine shared (most tests) or alone (``alone``) for a test's setup, call and teardown."""
    folder = run_dir()
    with open(folder / "turnstile", "a+") as turnstile, open(folder / "machine", "a+") as machine:
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_EX)  # no new test starts beside this one from now on
            fcntl.flock(machine, fcntl.LOCK_EX)  # once the running ones end
        else:
            fcntl.flock(turnstile, fcntl.LOCK_SH)
            fcntl.flock(machine, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
