"""The benchmark harness runs end to end and reports what it promises (tiny config)."""

import json
import subprocess
import sys


def _bench(*args):
    cmd = [sys.executable, "-m", "bench.decode", "--model", "random:tiny", "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_reports_both_systems():
    report = _bench("--shape", "1,4,2,4,4", "--repeats", "1")
    ours, torch_row = report["systems"]["torchax"], report["systems"]["torch"]
    for key in ("load_s", "compile_s", "first_call_s", "steady_s", "temp_bytes", "flops", "tflops", "percent_of_peak"):
        assert ours[key] is not None and ours[key] > 0, key
    assert ours["max_abs_err"] <= 2e-5  # fp32 parity, as the parity tests
    assert torch_row["max_abs_err"] == 0  # the reference is upstream fp32 itself
    assert ours["time_vs_ours"] == 1 and torch_row["time_vs_ours"] > 0
    assert report["peak_tflops"] > 0 and "measured" in report["peak_source"]


def test_bench_compile_only_runs_nothing():
    report = _bench("--shape", "1,4,5,8,8", "--compile-only", "--cpu-memory-scheduler")
    assert list(report["systems"]) == ["torchax"]
    ours = report["systems"]["torchax"]
    assert ours["temp_bytes"] > 0 and "steady_s" not in ours
    assert "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED" in report["xla_flags"]
