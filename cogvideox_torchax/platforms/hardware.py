"""The GPUs and TPUs the named accelerators stand for, from published figures, and what XLA is told of a GPU.

A `Gpu` of `GPUS` is one named GPU (memory, bandwidth, clocks, SMs, L2)
of a `GpuArchitecture` (compute capability and unit rates, one record per
generation); a `TpuGeneration` of `TPUS` is one TPU generation as its
compiler knows it (its name in a topology, HBM per device, devices per
chip, hosts). A named GPU or TPU of a known generation is one row; a new
generation is one record more. `gpu_target_config` writes a `Gpu` as the
device description a compile-only GPU compiler reads.
`cogvideox_torchax.platforms.accelerators` makes the named targets from
these rows. Data only: nothing here starts a compiler.
"""

from __future__ import annotations

import dataclasses

_GIB = 2**30


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
