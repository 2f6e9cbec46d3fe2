"""The one parity helper every test uses: shape, dtype, then max/mean error."""

from __future__ import annotations

import math

import numpy as np
import torch


def _as_f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def errors(actual, expected) -> tuple[float, float]:
    """Max and mean absolute difference, computed in float64."""
    diff = np.abs(_as_f64(actual) - _as_f64(expected))
    return float(diff.max(initial=0.0)), float(diff.mean()) if diff.size else 0.0


def assert_close(actual, expected, *, atol: float, rtol: float = 0.0, label: str = "", check_dtype: bool = True):
    """Asserts ``|actual - expected| <= atol + rtol * |expected|`` elementwise.

    Works on torch tensors, numpy and JAX arrays alike; bf16 is upcast before
    comparing. Shape (and, unless told otherwise, dtype) are checked first.
    Always prints the max and mean absolute error so a passing run still shows
    the margin.

    Returns:
        ``(max_abs_err, mean_abs_err)``.
    """
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{label} shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    if check_dtype:
        assert _dtype_name(actual) == _dtype_name(expected), f"{label} dtype {actual.dtype} != {expected.dtype}"
    a, e = _as_f64(actual), _as_f64(expected)
    max_err, mean_err = errors(a, e)
    print(f"[parity] {label}: max abs err {max_err:.3e}, mean abs err {mean_err:.3e} (atol {atol:g}, rtol {rtol:g})")
    assert np.isfinite(a).all(), f"{label}: non-finite values"
    bad = np.abs(a - e) > atol + rtol * np.abs(e)
    assert not bad.any(), (
        f"{label}: {int(bad.sum())} of {bad.size} elements off; max abs err {max_err:.3e} > atol {atol:g}"
    )
    return max_err, mean_err


def psnr(actual, reference) -> float:
    """PSNR in dB against ``reference``, peak = the reference's value range."""
    a, r = _as_f64(actual), _as_f64(reference)
    mse = float(np.mean((a - r) ** 2))
    peak = float(r.max() - r.min())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)
