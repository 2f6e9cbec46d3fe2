"""Named accelerators a program can be compiled for on any machine, without the hardware.

JAX runs the real XLA GPU and TPU compilers on "compile-only" devices
(`jax.experimental.topologies`): the result is a real executable whose
`memory_analysis()` and optimized HLO are what the device would run. It
cannot run, and nothing is autotuned, so times still need the hardware.

Each `Accelerator` here is written from published figures: device memory,
bandwidth, clocks and unit counts for the GPUs (Hopper: 132 SMs, 228 KiB of
shared memory and 64 Ki registers per SM, 50 MiB of L2), the chip
generation and host topology for the TPUs. ``budget`` is what a program may
use per device: for GPUs JAX's default preallocation (75 % of the device,
``XLA_PYTHON_CLIENT_MEM_FRACTION``), for TPUs the HBM the TPU compiler
itself reports as available (it refuses programs above it).

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

INSTALL_HINT = 'pip install -e ".[aot]" in the project folder'


class TargetUnavailableError(RuntimeError):
    """The compiler for a target is not installed or cannot start here."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One named target.

    Attributes:
        name: e.g. ``"h200"``, ``"v6e-8"``.
        platform: ``"cuda"`` or ``"tpu"``.
        devices: how many devices (chips) the name stands for.
        memory: bytes of device memory per device, as the device reports it.
        budget: bytes a program may use per device (see the module docstring).
        description: what the name is, for messages.
        topology: the TPU topology whose first ``devices`` chips are used.
    """

    name: str
    platform: str
    devices: int
    memory: int
    budget: int
    description: str
    topology: str = ""


_GIB = 2**30
# JAX preallocates this share of a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION's default).
GPU_PREALLOCATED = 0.75

# Per-device published figures of the Hopper GPUs: memory as the driver
# reports it, HBM bandwidth (bytes/s) and memory clock (kHz).
_HOPPER = {
    "h100": ("NVIDIA H100 80GB HBM3", 84_942_979_072, 3_352_320_000_000, 2_619_000),
    "h200": ("NVIDIA H200 141GB HBM3e", 151_397_597_184, 4_800_000_000_000, 3_750_000),
}
# TPU generations: the name the TPU compiler knows, the chips of one host
# (2x4 for 8), and the HBM per chip that compiler reports as available.
_TPU = {
    "v5e": ("v5e", 15.75 * _GIB, "TPU v5e (v5 lite), 16 GB HBM"),
    "v6e": ("v6e", 31.25 * _GIB, "TPU v6e (Trillium), 32 GB HBM"),
}


def _accelerators() -> dict[str, Accelerator]:
    found = {}
    for name, (description, memory, _, _) in _HOPPER.items():
        found[name] = Accelerator(name, "cuda", 1, memory, int(memory * GPU_PREALLOCATED), description)
    for gen, (compiler_name, hbm, description) in _TPU.items():
        for chips, topology in ((1, "2x2"), (8, "2x4")):
            found[f"{gen}-{chips}"] = Accelerator(
                f"{gen}-{chips}", "tpu", chips, int(hbm), int(hbm), f"{chips} x {description}",
                f"{compiler_name}:{topology}",
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


def gpu_target_config(name: str) -> str:
    """XLA's ``GpuTargetConfigProto`` (text form) for a Hopper GPU of `_HOPPER`.

    The compiler reads the unit counts and rates (fusion and tiling
    decisions), the memory size and the cuDNN version (which convolution
    fusions exist) from it.
    """
    description, memory, bandwidth, mem_clock = _HOPPER[name]
    # Ops per clock per SM of Hopper's units by XLA primitive type
    # (2 S8, 6 U8, 10 F16, 11 F32, 12 F64, 16 BF16, 19+ FP8 kinds).
    scalar = {4: (64, 1), 8: (64, 1), 10: (128, 2), 11: (128, 1), 12: (64, 1), 16: (128, 2)}
    matrix = {2: 1024, 6: 1024, 10: 512, 11: 256, 12: 32, 16: 512, 19: 1024, 20: 1024, 23: 1024, 24: 1024,
              25: 1024, 28: 1024, 29: 1024, 33: 1024, 35: 1024, 36: 1024}
    tensor_clock = 1.8295201  # GHz, the tensor cores' sustained clock
    rates = "\n".join(
        f"    rate_infos {{ key: {k} value {{ clock_rate_ghz: 1.98 units_per_core: {u} ops_per_clock: {o} }} }}"
        for k, (u, o) in scalar.items()
    )
    mma = "\n".join(
        f"    rate_infos {{ key: {k} value {{ clock_rate_ghz: {1.98 if k == 12 else tensor_clock} units_per_core: 4 "
        f"ops_per_clock: {o} }} }}"
        for k, o in matrix.items()
    )
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 feature_extension: ACCELERATED_FEATURES }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  scalar_unit_description {{
{rates}
  }}
  matrix_unit_description {{
{mma}
  }}
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  device_vendor: "NVIDIA Corporation"
  platform_version: "Compute Capability 9.0a"
  model_str: "sm_9.0a with {memory}B RAM, 132 cores, 1980000KHz clock, {mem_clock}KHz mem clock, 52428800B L2$"
  device_address_bits: 64
  pcie_bandwidth: 34359738368
  ecc_enabled: true
  name: "{description}"
  driver_version: "13.0.0"
  runtime_version: "12.8.0"
  compile_time_toolkit_version: "12.8.0"
  dnn_version: "9.10.0"
  cub_version: "3.1.2"
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 patch: 0 }}
device_description_str: "{description}"
"""


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
