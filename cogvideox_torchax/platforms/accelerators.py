"""Named accelerators a program can be compiled for on any machine, without the hardware.

JAX runs the real XLA GPU and TPU compilers on "compile-only" devices
(`jax.experimental.topologies`): the result is a real executable whose
`memory_analysis()` and optimized HLO are what the device would run. It
cannot run, and nothing is autotuned, so times still need the hardware.

Each `Accelerator` is made from one row of `cogvideox_torchax.platforms.hardware`
(a `Gpu` of `GPUS`, a `TpuGeneration` of `TPUS`). ``budget`` is what a
program may use per device: for GPUs JAX's default preallocation (75 %
of the device, ``XLA_PYTHON_CLIENT_MEM_FRACTION``), for TPUs the HBM the
TPU compiler itself reports as available (it refuses programs above it).
``autotune_allowance`` is what a program needs on the device beyond its
compile-only build (`CUDA_AUTOTUNE_ALLOWANCE`); the planner adds it.

The compilers are an install extra (``pip install "cogvideox-torchax[aot]"``:
the CUDA PJRT plugin with ptxas, and libtpu). `use_cpu_without_accelerators`
keeps them from being started, or printing anything, on a machine that has
neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

from cogvideox_torchax.platforms.hardware import GPUS, TPUS, gpu_target_config

INSTALL_HINT = 'pip install -e ".[aot]" in the project folder'


class TargetUnavailableError(RuntimeError):
    """The compiler for a target is not installed or cannot start here."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One named target.

    Attributes:
        name: e.g. ``"h200"``, ``"v6e-8"``.
        platform: ``"cuda"`` or ``"tpu"``.
        devices: how many devices the name stands for (chips; TensorCores on v7x, two per chip).
        memory: bytes of device memory per device, as the device reports it.
        budget: bytes a program may use per device (see the module docstring).
        description: what the name is, for messages.
        topology: the TPU topology whose first ``devices`` devices are used.
        autotune_allowance: bytes per device a program compiled here needs on
            the device beyond its ``memory_analysis()`` (`CUDA_AUTOTUNE_ALLOWANCE`
            on GPUs; 0 on TPUs, none measured).
    """

    name: str
    platform: str
    devices: int
    memory: int
    budget: int
    description: str
    topology: str = ""
    autotune_allowance: int = 0


# JAX preallocates this share of a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION's default).
GPU_PREALLOCATED = 0.75

# What a CUDA program needs on the device beyond its compile-only build's
# memory_analysis(): the cuDNN workspaces XLA's autotuning picks there (a
# compile-only build does not autotune: each convolution's scratch is u8[0]).
# Measured on one H100 (2026-11-27, jax 0.11.2; the handbook's
# results/h100-2026-11-27.md): temporaries 1.28 GiB (2b, 49 x 480x720) and
# 1.35 GiB (1.5, 81 x 768x1360) above the same programs compiled for an
# H100 without it (jax 0.10.2), 1.39 and 1.57 above jax 0.12's for an H200:
# near the same bytes at 3x the pixels (22 % and 9 % of the program), so the
# workspace of the largest convolutions, which the time chunks bound, not a
# share of the program. Wan 2.1's 720p program: 0.99 GiB, the whole of it
# autotuning's (with it off, the device's bytes equal the compile-only
# build's; results/h100-wan-autotune-2026-11-28.md). The largest, rounded
# up; measured on Hopper only, taken for every CUDA target.
CUDA_AUTOTUNE_ALLOWANCE = int(1.6 * 2**30)


def _accelerators() -> dict[str, Accelerator]:
    found = {}
    for name, gpu in GPUS.items():
        found[name] = Accelerator(name, "cuda", 1, gpu.memory, int(gpu.memory * GPU_PREALLOCATED), gpu.description,
                                  autotune_allowance=CUDA_AUTOTUNE_ALLOWANCE)
    for gen, tpu in TPUS.items():
        for chips, topology in tpu.hosts:
            found[f"{gen}-{chips}"] = Accelerator(
                f"{gen}-{chips}", "tpu", chips * tpu.devices_per_chip, tpu.hbm, tpu.hbm,
                f"{chips} x {tpu.description}", f"{tpu.compiler_name}:{topology}",
            )
    return found


TARGETS: dict[str, Accelerator] = _accelerators()


def get(name: str) -> Accelerator:
    """The `Accelerator` called ``name`` (case-insensitive).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    key = str(name).strip().lower()
    if key not in TARGETS:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}")
    return TARGETS[key]


def _accelerator_visible() -> bool:
    # What JAX itself looks at to suggest a missing GPU or TPU backend.
    from jax._src import hardware_utils

    if hardware_utils.has_visible_nvidia_gpu() or os.path.exists("/dev/kfd"):
        return True
    return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0


@contextlib.contextmanager
def _quiet_stderr():
    # The plugins' start-up notes come from C++ as well as Python: both write
    # to file descriptor 2.
    import sys

    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr at all (started with 2>&-): nothing to quiet
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        if sys.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def use_cpu_without_accelerators() -> None:
    """Starts JAX on the CPU, quietly, where no GPU or TPU is visible and nothing chose otherwise.

    With the compiler extra installed, JAX would start its CUDA and TPU
    plugins on every machine and print their failures (no driver, no TPU)
    on each start. Where no accelerator is visible, the CPU is the backend
    JAX would pick anyway: this picks it first. With ``JAX_PLATFORMS=cpu``
    the plugins are still discovered (quietly). Nothing happens when JAX
    has already started, another platform was chosen, or a GPU or TPU is
    visible.
    """
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    if not jax.config.jax_platforms:
        if _accelerator_visible():
            return
        jax.config.update("jax_platforms", "cpu")
    elif jax.config.jax_platforms != "cpu":
        return
    # Only the plugins' discovery (where they print), not the backends:
    # jax.distributed must still be able to start after this.
    with _quiet_stderr():
        xla_bridge._discover_and_register_pjrt_plugins()


# The CUDA PJRT plugins JAX publishes, newest first: either one compiles for Hopper.
_CUDA_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def _cuda_plugin_library() -> Path | None:
    for module in _CUDA_PLUGINS:
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:  # no jax_plugins namespace at all
            return None
        library = Path(spec.origin).parent / "xla_cuda_plugin.so" if spec and spec.origin else None
        if library is not None and library.exists():
            return library
    return None


def compiler_missing(platform: str) -> str | None:
    """Why the compile-only compiler for ``platform`` (``"cuda"`` or ``"tpu"``) cannot start here, or None.

    Checks that it is installed, without starting it.
    """
    if platform == "cuda" and _cuda_plugin_library() is None:
        return f"the CUDA compiler (a jax CUDA PJRT plugin) is not installed: {INSTALL_HINT}"
    if platform == "tpu" and importlib.util.find_spec("libtpu") is None:
        return f"the TPU compiler (libtpu) is not installed: {INSTALL_HINT}"
    return None


def _start_cuda_compiler() -> None:
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    # The plugins' discovery, run first under the CPU platform: discovered later
    # (by the topology call) with no platform chosen, the CUDA 13 plugin checks
    # the CUDA runtime's version, which crashes the process where torch's CUDA
    # 13 libraries are installed and no driver is (torch 2.15, jax 0.12.1).
    use_cpu_without_accelerators()
    if xla_client.pjrt_plugin_loaded("cuda"):
        return
    missing = compiler_missing("cuda")
    if missing:
        raise TargetUnavailableError(missing)
    # JAX skipped it at start-up (no GPU here): register it for compiling only.
    with _quiet_stderr():
        xla_bridge.register_plugin(
            "cuda", priority=500, library_path=str(_cuda_plugin_library()),
            options=xla_client.generate_pjrt_gpu_plugin_options(),
        )


@functools.cache
def compile_devices(name: str) -> tuple[Any, ...]:
    """The compile-only devices of target ``name`` (one per device it stands for).

    Raises:
        ValueError: an unknown name.
        TargetUnavailableError: its compiler is not installed or did not start.
    """
    from jax.experimental import topologies

    acc = get(name)
    try:
        if acc.platform == "cuda":
            _start_cuda_compiler()
            with _quiet_stderr():
                topo = topologies.get_topology_desc(
                    platform="cuda", topology=f"1x1x{acc.devices}", target_config=gpu_target_config(acc.name)
                )
        else:
            missing = compiler_missing("tpu")
            if missing:
                raise TargetUnavailableError(missing)
            # libtpu probes the host for a TPU it is not on; these say which one it compiles for.
            os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{acc.topology.split(':')[0]}-8")
            os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
            os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
            # A compile-only client holds no chip, yet libtpu's one-process
            # lockfile would refuse a second compiling process (a test beside
            # a bench) with "Internal error when accessing libtpu multi-process lockfile".
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            with _quiet_stderr():
                topo = topologies.get_topology_desc(acc.topology, "tpu")
    except TargetUnavailableError:
        raise
    except Exception as e:  # the plugin's own errors: its message says what failed
        raise TargetUnavailableError(f"cannot start the {acc.platform} compiler for {name}: {e}") from e
    return tuple(topo.devices[: acc.devices])


def target_mesh(name: str, mesh: Any = None):
    """A ``("dp", "tp")`` mesh over the compile-only devices of ``name``.

    ``mesh``: None (every device on ``tp``), ``"dp=1,tp=8"`` or ``(dp, tp)``;
    it must use at most the target's devices.
    """
    import numpy as np
    from jax.sharding import Mesh

    from cogvideox_torchax.parallel.sharding import parse_mesh_spec

    acc = get(name)
    dp, tp = (1, acc.devices) if mesh is None else parse_mesh_spec(mesh) if isinstance(mesh, str) else tuple(mesh)
    if dp * tp > acc.devices:
        raise ValueError(f"mesh dp={dp},tp={tp} needs {dp * tp} devices; target {acc.name} has {acc.devices}")
    devices = compile_devices(acc.name)
    return Mesh(np.array(devices[: dp * tp]).reshape(dp, tp), ("dp", "tp"))
