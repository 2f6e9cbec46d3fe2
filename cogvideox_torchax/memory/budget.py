"""Memory budgets and the decode plans that fit them, chosen from compiled programs before anything runs.

A compiled program states its memory (`jax.stages.Compiled.memory_analysis`:
temporaries, arguments, outputs per device) and a device states its capacity
(``memory_stats()["bytes_limit"]`` on GPU and TPU, the host's available
memory on the CPU). `TorchaxVAE` compiles candidate plans in order of
expected speed (the whole decode, then upstream's tiling with growing tile
counts) and runs the first that fits the budget, keeping `SAFETY_MARGIN` of
it free. Tiling changes results only as upstream's own tiled decode does.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from jax.sharding import Mesh

from cogvideox_torchax.families import tiling as family_tiling
from cogvideox_torchax.platforms import hlo
from cogvideox_torchax.spellings import parse_memory  # noqa: F401  (part of this module's API)

# Left free of every budget: XLA's memory analysis does not count the
# allocator's fragmentation or the runtime's own buffers.
SAFETY_MARGIN = 0.10

# Tiles per axis of the candidate plans after the whole decode, in order.
TILE_COUNTS = family_tiling.COUNTS



class MemoryBudgetError(ValueError):
    """No plan fits the memory budget; raised before anything runs."""


def host_available() -> int:
    """The host's available memory in bytes (``MemAvailable``), what a host-side step may still take."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def device_capacity(mesh: Mesh) -> tuple[int, str]:
    """Bytes one device of ``mesh`` can hold, and where the figure comes from.

    GPU and TPU: the smallest ``bytes_limit`` among the mesh's devices in
    this process (another host's devices cannot be asked). CPU: the host's
    available memory, shared by the mesh's devices on it. Under
    jax.distributed each process answers for its own devices; the VAE takes
    the least of the processes' answers.
    """
    import jax

    here = jax.process_index()
    devices = [d for d in mesh.devices.flat if d.process_index == here] or list(mesh.devices.flat)
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices if d.platform != "cpu"]
    if limits and all(limits):
        return min(limits), f"{devices[0].device_kind} bytes_limit"
    return host_available() // len(devices), f"host available memory / {len(devices)} device(s)"


class Candidate(NamedTuple):
    """A way to run a shape before it is compiled.

    `enable_tiling` keywords (None: as set), a ``(dp, tp)`` mesh (None: the
    VAE's own) and the named accelerator it compiles for (None: the VAE's
    own devices).
    """

    name: str
    tiling: dict[str, Any] | None
    mesh: tuple[int, int] | None
    target: str | None = None


def tp_candidates(mesh: tuple[int, int], devices: int, name: str = "whole") -> Iterator[Candidate]:
    """Meshes with more devices on ``tp`` (doubling, then all) that ``devices`` devices allow, keeping ``dp``."""
    dp, tp = mesh
    most = devices // dp
    sizes = []
    k = tp * 2
    while k < most:
        sizes.append(k)
        k *= 2
    if most > tp:
        sizes.append(most)
    for size in sizes:
        yield Candidate(f"{name} on dp={dp},tp={size}", None, (dp, size))


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """One way to run a shape, with its compiled bytes per device.

    Attributes:
        name: ``"whole"`` (no tiling, or the VAE's own), or
            ``"tiles of HxW latents"``.
        tiling: `enable_tiling` keywords, or None for no tiling (or the
            user's own tiling, as set on the VAE).
        bytes: temporaries + arguments + outputs of the compiled program, per
            device, and ``allowance``.
        budget: the bytes the plan had to fit, margin already taken off.
        mesh: ``(dp, tp)`` of a mesh with more devices than the VAE's own, or
            None for the VAE's mesh; a target's plan always names its mesh.
        target: the named accelerator the plan was compiled for
            (`cogvideox_torchax.platforms.accelerators`), None for the VAE's own devices.
        allowance: of ``bytes``, what the target's device needs beyond the
            compiled program (`Accelerator.autotune_allowance`: cuDNN workspaces
            autotuned there); 0 on the VAE's own devices, whose compile counts them.
    """

    name: str
    tiling: dict[str, Any] | None
    bytes: int
    budget: int | None
    mesh: tuple[int, int] | None = None
    target: str | None = None
    allowance: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def usable(budget: int) -> int:
    """What of ``budget`` a plan may use: all but `SAFETY_MARGIN`."""
    return int(budget * (1 - SAFETY_MARGIN))


def compiler_options(acc: Any) -> dict[str, str] | None:
    """XLA options every program compiled for the named accelerator ``acc`` takes: a TPU's HBM limit at `usable`.

    libtpu 0.0.50 (jax 0.12) leaves a program's buffers loosely packed while
    the loose heap still fits the chip, and its ``memory_analysis()``
    counts the heap's fragmentation twice (temporaries = 2 x heap - peak
    live bytes): the CogVideoX 1.5 decode on one v6e chip, a 27.75 GiB heap
    and 38.22 GiB of temporaries. Told the usable budget it packs as libtpu
    0.0.42 does (20.56 GiB of heap, 23.86 of temporaries). A program above
    that budget could not be planned anyway (temporaries are at least the
    heap), so the limit refuses none a plan would take.
    """
    return _hbm_limit(acc.platform, acc.budget)


def attached_compiler_options(mesh: Mesh) -> dict[str, str] | None:
    """`compiler_options` for programs that run on ``mesh``'s own devices: on TPUs, the HBM limit at `usable`.

    The capacity is the devices' ``bytes_limit`` (`device_capacity`), the
    figure ``max_memory="auto"`` plans against.
    """
    platform = mesh.devices.flat[0].platform
    if platform != "tpu":
        return None
    return _hbm_limit(platform, device_capacity(mesh)[0])


def _hbm_limit(platform: str, capacity: int) -> dict[str, str] | None:
    if platform != "tpu":
        return None
    return {"xla_tpu_max_hbm_size_mib": str(usable(capacity) // 2**20)}


def budget_for(need: int) -> float:
    """The budget whose `usable` part is ``need`` bytes (the inverse of `usable`)."""
    return need / (1 - SAFETY_MARGIN)


def compiled_bytes(compiled: Any) -> int:
    """Temporaries + arguments + outputs of a compiled program, per device, and what its host calls take.

    A convolution called into the host's torch (`kernels.host_conv`) computes into torch's own tensor,
    copied into the program's buffer after, and oneDNN may reorder its operands: outside XLA's count.
    Allowed for as twice the largest such result (one 128 -> 128 convolution of 113 MB grew the
    process by 76 MB; XLA's channels-last form of it took 255 MB of temporaries).
    """
    m = compiled.memory_analysis()
    if m is None:
        return 0
    return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes) + _host_call_bytes(compiled)


def _host_call_bytes(compiled: Any) -> int:
    text = compiled.as_text() or ""
    if hlo.HOST_CONV_TARGET not in text:
        return 0
    return 2 * max((c.bytes for c in hlo.compiled_ops(text)[0] if c.op == "host-conv"), default=0)


_REFUSED = re.compile(r"RESOURCE_EXHAUSTED.*?HLO temporaries \(([\d.]+)G\)", re.S)


def refused_bytes(error: BaseException) -> int | None:
    """The bytes a compiler said a program needs when it refused it for memory, else None.

    The TPU compiler refuses a program whose temporaries exceed the chip's
    HBM ("... HLO temporaries (54.54G) exceeds available HBM (31.25G)",
    GiB) instead of returning one.
    """
    m = _REFUSED.search(str(error))
    return None if m is None else int(float(m.group(1)) * 2**30)


def human(n: int) -> str:
    """Bytes as GiB (or MiB below one GiB), for messages."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
