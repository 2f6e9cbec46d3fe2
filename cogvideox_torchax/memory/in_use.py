"""Device memory in use, for the ``--memory-report`` of the command line.

Accelerator backends count their own allocations (``device.memory_stats()``
has ``bytes_in_use``); the CPU backend has no such counter, so there the
figure is the sum of the live JAX arrays' shards on each device. The two are
not the same measure (the allocator also holds freed-but-cached blocks, and
XLA temporaries live only during a call), so each report says which it is.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

ENV_VAR = "COGVIDEOX_TORCHAX_MEMORY_REPORT"


def live_device_bytes() -> tuple[dict[str, int], str]:
    """Bytes in use per device and how they were counted.

    Returns:
        ``({device: bytes}, source)``; source is ``"memory_stats"`` when
        every device reports ``bytes_in_use``, else ``"live_arrays"``.
    """
    import jax

    devices = jax.local_devices()
    stats = [d.memory_stats() or {} for d in devices]
    if all("bytes_in_use" in s for s in stats):
        return {str(d): int(s["bytes_in_use"]) for d, s in zip(devices, stats, strict=True)}, "memory_stats"
    per_device = {str(d): 0 for d in devices}
    # Counted per buffer, not per array: a shard's ``.data`` is itself a live
    # array aliasing the same buffer (and jax keeps it cached on its parent),
    # so counting arrays would count shards twice once anyone looked at them.
    seen: set[tuple[str, int]] = set()
    for array in jax.live_arrays():
        if array.is_deleted():
            continue
        for shard in array.addressable_shards:
            data = shard.data
            key = (str(shard.device), data.unsafe_buffer_pointer())
            if key[0] in per_device and key not in seen:
                seen.add(key)
                per_device[key[0]] += data.nbytes
    return per_device, "live_arrays"


def enabled_by_env() -> bool:
    """True when ``$COGVIDEOX_TORCHAX_MEMORY_REPORT`` is set to something other than 0/empty."""
    return os.environ.get(ENV_VAR, "") not in ("", "0")


def report(stage: str, file: TextIO | None = None) -> int:
    """Prints one line of live device memory after ``stage``; returns the total bytes."""
    per_device, source = live_device_bytes()
    total = sum(per_device.values())
    peak = max(per_device.values(), default=0)
    print(
        f"[memory] after {stage}: {total / 2**20:.1f} MiB live on {len(per_device)} device(s), "
        f"max {peak / 2**20:.1f} MiB per device ({source})",
        file=file or sys.stderr,
    )
    return total
