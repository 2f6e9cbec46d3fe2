"""Named accelerators a program can be compiled for on any machine, without the hardware.

JAX runs the real XLA GPU and TPU compilers on "compile-only" devices
(`jax.experimental.topologies`): the result is a real executable whose
`memory_analysis()` and optimized HLO are what the device would run. It
cannot run, and nothing is autotuned, so times still need the hardware.

Each `Accelerator` is made from one row, written from published figures:
a `Gpu` of `GPUS` (memory, bandwidth, clocks, SMs, L2, and its
`GpuArchitecture`: compute capability and unit rates, one record per
generation) or a `TpuGeneration` of `TPUS` (the compiler's name, HBM per
device, devices per chip, hosts). A named GPU or TPU of a known generation
is one row; a new generation is one record more. ``budget`` is what a program may
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
        devices: how many devices the name stands for (chips; TensorCores on v7x, two per chip).
        memory: bytes of device memory per device, as the device reports it.
        budget: bytes a program may use per device (see the module docstring).
        description: what the name is, for messages.
        topology: the TPU topology whose first ``devices`` devices are used.
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


@dataclasses.dataclass(frozen=True)
class GpuArchitecture:
    """What one GPU generation's units do per clock, as XLA's device description states it.

    Attributes:
        compute_capability: ``(major, minor)``; the ``a`` (accelerated) features are on.
        scalar: ``{XLA primitive type: (units per SM, ops per clock)}`` of the CUDA cores
            (2 S8, 6 U8, 10 F16, 11 F32, 12 F64, 16 BF16, 19+ FP8 kinds, 32 F4E2M1FN).
        matrix: ``{XLA primitive type: ops per clock}`` of the tensor cores (4 per SM).
    """

    compute_capability: tuple[int, int]
    scalar: dict[int, tuple[int, int]]
    matrix: dict[int, int]


HOPPER = GpuArchitecture(
    (9, 0),
    {4: (64, 1), 8: (64, 1), 10: (128, 2), 11: (128, 1), 12: (64, 1), 16: (128, 2)},
    {2: 1024, 6: 1024, 10: 512, 11: 256, 12: 32, 16: 512, 19: 1024, 20: 1024, 23: 1024, 24: 1024, 25: 1024,
     28: 1024, 29: 1024, 33: 1024, 35: 1024, 36: 1024},
)
# Tensor cores at twice Hopper's rates, FP64 at half; FP4 added.
BLACKWELL = GpuArchitecture(
    (10, 0),
    {4: (64, 1), 8: (64, 1), 10: (128, 1), 11: (128, 1), 12: (64, 1), 16: (128, 1)},
    {2: 2048, 6: 2048, 10: 1024, 11: 512, 12: 16, 16: 1024, 19: 2048, 20: 2048, 23: 2048, 24: 2048, 25: 2048,
     28: 2048, 29: 2048, 32: 4096, 33: 2048, 35: 2048, 36: 2048},
)

# Blackwell Ultra: Blackwell's units at compute capability 10.3.
BLACKWELL_ULTRA = dataclasses.replace(BLACKWELL, compute_capability=(10, 3))


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One named GPU, from published figures (those of XLA's own device specs where it has one).

    Attributes:
        description: the device's name as the driver reports it.
        architecture: its `GpuArchitecture`.
        sms: streaming multiprocessors.
        memory: device memory in bytes, as the driver reports it.
        bandwidth: HBM bandwidth, bytes/s.
        memory_clock: kHz.
        l2: L2 cache bytes.
        clock: SM clock, GHz.
        tensor_clock: the tensor cores' sustained clock, GHz.
        pcie: host link bandwidth, bytes/s.
    """

    description: str
    architecture: GpuArchitecture
    sms: int
    memory: int
    bandwidth: int
    memory_clock: int
    l2: int
    clock: float
    tensor_clock: float
    pcie: int


# One row per GPU. Hopper: 132 SMs, 50 MiB of L2. Blackwell: XLA's b200 and
# gb200 specs (B200's memory there, 178.4 GiB, is near the 180 GB published
# and the 183,359 MiB nvidia-smi shows; not read from a device here).
GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 80GB HBM3", HOPPER, 132, 84_942_979_072, 3_352_320_000_000, 2_619_000, 52_428_800,
                1.98, 1.8295201, 34_359_738_368),
    "h200": Gpu("NVIDIA H200 141GB HBM3e", HOPPER, 132, 151_397_597_184, 4_800_000_000_000, 3_750_000, 52_428_800,
                1.98, 1.8295201, 34_359_738_368),
    "b200": Gpu("NVIDIA B200", BLACKWELL, 148, 191_514_411_008, 7_672_320_000_000, 3_996_000, 132_644_864,
                1.965, 1.8353101, 68_719_476_736),
    "gb200": Gpu("NVIDIA GB200", BLACKWELL, 152, 197_897_748_480, 7_928_064_000_000, 3_996_000, 135_528_448,
                 2.062, 1.9259081, 2_147_483_648),
    "b300": Gpu("NVIDIA B300", BLACKWELL_ULTRA, 158, 297_021_865_984, 7_936_000_000_000, 3_996_000, 135_528_448,
                1.965, 1.8353101, 68_719_476_736),
}


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation, as the TPU compiler knows it.

    Attributes:
        description: for messages.
        compiler_name: the generation's name in a topology (``"v6e"``, ``"tpu7x"``).
        hbm: bytes per device that compiler reports as available (it refuses more).
        devices_per_chip: devices (TensorCores) one chip shows (v7x: 2).
        hosts: ``(chips, topology)`` per name: ``<generation>-<chips>``
            uses the first chips of that topology.
    """

    description: str
    compiler_name: str
    hbm: int
    devices_per_chip: int
    hosts: tuple[tuple[int, str], ...]


# One row per generation. v7x and v5p: one host is 2x2x1 (4 chips); the
# compiler's figures of 2026-11 (libtpu 0.0.50.1 and 0.0.51 alike).
TPUS: dict[str, TpuGeneration] = {
    "v5e": TpuGeneration("TPU v5e (v5 lite), 16 GB HBM", "v5e", int(15.75 * _GIB), 1, ((1, "2x2"), (8, "2x4"))),
    "v6e": TpuGeneration("TPU v6e (Trillium), 32 GB HBM", "v6e", int(31.25 * _GIB), 1, ((1, "2x2"), (8, "2x4"))),
    "v5p": TpuGeneration("TPU v5p, 95 GB HBM", "v5p", int(95.73 * _GIB), 1, ((1, "2x2x1"), (4, "2x2x1"))),
    "v7x": TpuGeneration(
        "TPU v7x (Ironwood), 192 GB HBM, two TensorCores", "tpu7x", int(94.74 * _GIB), 2, ((1, "2x2x1"), (4, "2x2x1"))
    ),
}


def _accelerators() -> dict[str, Accelerator]:
    found = {}
    for name, gpu in GPUS.items():
        found[name] = Accelerator(name, "cuda", 1, gpu.memory, int(gpu.memory * GPU_PREALLOCATED), gpu.description)
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


def gpu_target_config(name: str) -> str:
    """XLA's ``GpuTargetConfigProto`` (text form) for a GPU of `GPUS`.

    The compiler reads the unit counts and rates (fusion and tiling
    decisions), the memory size and the cuDNN version (which convolution
    fusions exist) from it.
    """
    g = GPUS[name]
    arch = g.architecture
    major, minor = arch.compute_capability
    rates = "\n".join(
        f"    rate_infos {{ key: {k} value {{ clock_rate_ghz: {g.clock} units_per_core: {u} ops_per_clock: {o} }} }}"
        for k, (u, o) in arch.scalar.items()
    )
    mma = "\n".join(
        f"    rate_infos {{ key: {k} value {{ clock_rate_ghz: {g.clock if k == 12 else g.tensor_clock} "
        "units_per_core: 4 "
        f"ops_per_clock: {o} }} }}"
        for k, o in arch.matrix.items()
    )
    capability = f"major: {major}" + (f" minor: {minor}" if minor else "") + " feature_extension: ACCELERATED_FEATURES"
    cc = f"{major}.{minor}a"
    model = f"sm_{cc} with {g.memory}B RAM, {g.sms} cores, {round(g.clock * 1e6)}KHz clock, "
    model += f"{g.memory_clock}KHz mem clock, {g.l2}B L2$"
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {g.sms}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {g.bandwidth}
  l2_cache_size: {g.l2}
  clock_rate_ghz: {g.clock}
  device_memory_size: {g.memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ {capability} }}
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
  platform_version: "Compute Capability {cc}"
  model_str: "{model}"
  device_address_bits: 64
  pcie_bandwidth: {g.pcie}
  ecc_enabled: true
  name: "{g.description}"
  driver_version: "13.0.0"
  runtime_version: "12.8.0"
  compile_time_toolkit_version: "12.8.0"
  dnn_version: "9.10.0"
  cub_version: "3.1.2"
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 patch: 0 }}
device_description_str: "{g.description}"
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
