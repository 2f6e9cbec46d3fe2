"""Running over several processes (hosts) with JAX's own runtime, `jax.distributed`.

Every process runs the same program on the same arguments (JAX's
multi-controller model): `initialize_distributed` joins the cluster before
JAX starts, `sharding.make_mesh` then spans every process's devices (``dp``
across processes, ``tp`` inside one), weights and inputs are placed on the
global mesh from each process's copy (`sharding.place`), and results come
back to the host whole with `to_host`. The command lines do their reading
and writing on process 0 only and share what it read with `share_array` /
`share_json`.

A process that dies makes the others stop within the heartbeat timeout
(JAX's coordination service ends them, exit code 134, with a message that
another task died); a cluster that does not come together within
``timeout_s`` ends every waiting process with one line and `EXIT_TIMEOUT`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import numpy as np

# The exit code of a process whose cluster did not start in time (the
# command lines' "error of the tool or the system").
EXIT_TIMEOUT = 1


class DistributedError(RuntimeError):
    """The cluster cannot be formed as asked; the message says what to pass instead."""


def _jax():
    import jax

    return jax


def is_initialized() -> bool:
    """Whether `jax.distributed` has been started in this process."""
    return bool(_jax().distributed.is_initialized())


def process_index() -> int:
    """This process's index (0 when not distributed)."""
    return int(_jax().process_index())


def process_count() -> int:
    """How many processes run the program (1 when not distributed)."""
    return int(_jax().process_count())


def is_primary() -> bool:
    """True on process 0: the one that reads inputs, writes outputs and prints the summary."""
    return process_index() == 0


def _timed_out(timeout_s: float, where: str) -> None:
    # Runs on a timer thread while `jax.distributed.initialize` waits (it
    # releases the GIL); JAX's own timeout would abort with a C++ stack.
    print(
        f"error: the jax.distributed cluster did not start within {timeout_s:g} s ({where}): "
        "a process is missing, or cannot reach the coordinator; nothing was written",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_TIMEOUT)


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: float = 300.0,
    heartbeat_timeout_s: int = 100,
) -> None:
    """Joins this process to a `jax.distributed` cluster; call before any other JAX use.

    With no arguments, JAX's cluster auto-detection names the coordinator
    and this process (TPU pod slices, SLURM, Open MPI); elsewhere pass all
    three. CPU devices exchange data with gloo collectives. Calling it again
    in a process that has joined does nothing.

    Args:
        coordinator_address: ``HOST:PORT`` of process 0, reachable by all.
        num_processes: how many processes take part.
        process_id: this one's index, ``0 .. num_processes - 1``.
        timeout_s: how long to wait for every process to join; after it this
            process prints one line and exits with `EXIT_TIMEOUT`.
        heartbeat_timeout_s: after a process stops answering this long, the
            others are ended by JAX's coordination service.

    Raises:
        DistributedError: the arguments are incomplete or contradictory, or
            no cluster could be detected.
    """
    jax = _jax()
    if jax.distributed.is_initialized():
        return
    given = [v is not None for v in (coordinator_address, num_processes, process_id)]
    if any(given) and not all(given):
        raise DistributedError(
            "a cluster needs all of the coordinator (HOST:PORT), the number of processes and this process's id, "
            "or none of them for auto-detection (TPU pod slices, SLURM, Open MPI)"
        )
    if all(given):
        host, _, port = coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise DistributedError(f"the coordinator must be HOST:PORT, got {coordinator_address!r}")
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise DistributedError(
                f"the process id must be in 0..{num_processes - 1} for {num_processes} processes, got {process_id}"
            )
    if not timeout_s > 0:
        raise DistributedError(f"the cluster timeout must be positive, got {timeout_s}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = (
        f"coordinator {coordinator_address}, process {process_id} of {num_processes}"
        if all(given)
        else "auto-detected cluster"
    )
    watchdog = threading.Timer(timeout_s, _timed_out, args=(timeout_s, where))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            # Ours fires first, with a line instead of JAX's abort.
            initialization_timeout=int(timeout_s) + 30,
            heartbeat_timeout_seconds=int(heartbeat_timeout_s),
        )
    except ValueError as e:  # JAX found no cluster to detect
        raise DistributedError(
            f"no cluster detected ({e}); pass the coordinator HOST:PORT, the number of processes and this "
            "process's id"
        ) from e
    finally:
        watchdog.cancel()


def to_host(x: Any) -> np.ndarray:
    """A JAX array as one host NumPy array, gathered from every process when it spans several.

    Every process must call it (it is a collective when the array is not
    fully addressable here).
    """
    jax = _jax()
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _broadcast(x: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(x))


def share_array(x: np.ndarray | None, shape: tuple[int, ...] | None = None, dtype: Any = None) -> np.ndarray:
    """Process 0's array, on every process; a copy of ``x`` when not distributed.

    Every process must call it. Process 0 passes the array; the others
    pass None (or anything: it is ignored) and learn its shape and dtype
    first, so only process 0 needs to have read it.
    """
    if process_count() == 1:
        return np.asarray(x)
    header = share_json(None if not is_primary() else {"shape": list(x.shape), "dtype": np.asarray(x).dtype.name})
    shape, dtype = tuple(header["shape"]), np.dtype(_jax().numpy.dtype(header["dtype"]))
    # Sent as bytes: the collective sums, and every dtype (bfloat16 too) fits in uint8.
    local = np.ascontiguousarray(x, dtype=dtype) if is_primary() else np.zeros(shape, dtype)
    data = _broadcast(local.reshape(-1).view(np.uint8))
    return data.view(dtype).reshape(shape)


def share_json(obj: Any) -> Any:
    """Process 0's JSON-able value, on every process (the others pass anything); ``obj`` when not distributed.

    Every process must call it.
    """
    if process_count() == 1:
        return obj
    payload = np.frombuffer(json.dumps(obj).encode(), np.uint8) if is_primary() else None
    size = int(_broadcast(np.asarray(0 if payload is None else payload.size, np.int64)))
    # Padded to a power of two so that few broadcast programs are compiled.
    padded = np.zeros(1 << max(size - 1, 0).bit_length(), np.uint8)
    if payload is not None:
        padded[:size] = payload
    return json.loads(_broadcast(padded)[:size].tobytes().decode())


def gather_ints(value: int) -> list[int]:
    """Every process's ``value`` (an exit code, a size in MiB), in process order.

    A collective; ``[value]`` alone when not distributed.
    """
    if process_count() == 1:
        return [int(value)]
    from jax.experimental import multihost_utils

    values = multihost_utils.process_allgather(np.asarray([value], np.int32))
    return [int(v) for v in np.asarray(values).reshape(-1)]
