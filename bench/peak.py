"""What "peak" means for the device a benchmark ran on.

On a CPU there is no datasheet number worth trusting (clocks, AVX-512/AMX
use and core counts vary), so the peak is measured: the best of a few large
XLA matmuls in the benchmark's dtype. For known accelerators a table of
dense peaks from the vendors' datasheets is used instead.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# Dense (no sparsity) peak TFLOP/s per chip, from the vendors' datasheets:
# NVIDIA H100 SXM5 and H200 datasheets (bf16 989, tf32 495; plain fp32 67);
# Google Cloud TPU v5e / v6e system architecture pages (bf16 197 / 918).
# fp32 matmuls on TPU run as multi-pass bf16; no fp32 figure is published.
KNOWN_PEAKS_TFLOPS: dict[str, dict[str, float]] = {
    "NVIDIA H100 80GB HBM3": {"bfloat16": 989.0, "float32": 67.0},
    "NVIDIA H200": {"bfloat16": 989.0, "float32": 67.0},
    "TPU v5 lite": {"bfloat16": 197.0},
    "TPU v6 lite": {"bfloat16": 918.0},
}


def measured_matmul_tflops(dtype: str, n: int = 4096, repeats: int = 3) -> float:
    """Best TFLOP/s of an ``n x n x n`` XLA matmul in ``dtype`` on the default device."""
    jdt = jnp.dtype(dtype)
    a = jnp.ones((n, n), jdt)
    f = jax.jit(lambda a, b: a @ b)
    f(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e12


def device_peak(dtype: str) -> tuple[float, str]:
    """Peak TFLOP/s for ``dtype`` on the default device and where it came from."""
    kind = jax.devices()[0].device_kind
    table = KNOWN_PEAKS_TFLOPS.get(kind, {})
    if dtype in table:
        return table[dtype], f"datasheet ({kind})"
    return measured_matmul_tflops(dtype), f"measured 4096^3 XLA matmul ({kind})"
