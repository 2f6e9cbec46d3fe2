"""The benchmark harness runs end to end and reports what it promises (tiny config)."""

import json
import subprocess
import sys

# The fields issue 5 names for every result, null where a figure does not apply.
RESULT_KEYS = (
    "system",
    "load_s",
    "compile_s",
    "steady_s",
    "steady_all_s",
    "temp_bytes",
    "argument_bytes",
    "flops",
    "tflops_per_s",
    "pct_of_peak",
    "max_abs_err",
    "mean_abs_err",
)


def _bench(*args):
    cmd = [sys.executable, "-m", "bench.decode", "--model", "random:tiny", "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_measures_all_three_systems_alike():
    report = _bench("--shape", "2,4,4", "--repeats", "2", "--profile")
    for key in ("device", "versions", "config", "shape", "dtype", "mesh", "commit"):
        assert key in report, key
    assert report["shape"] == [1, 4, 2, 4, 4] and report["config"]["latent_channels"] == 4
    rows = {r["system"]: r for r in report["results"]}
    assert list(rows) == ["torchax", "flax", "torch"]
    for row in rows.values():
        assert all(k in row for k in RESULT_KEYS), sorted(set(RESULT_KEYS) - set(row))
        assert len(row["steady_all_s"]) == 2 and row["steady_s"] > 0
        assert row["tflops_per_s"] > 0 and row["pct_of_peak"] > 0
        # Every system's breakdown accounts for its op time by category.
        profile = row["profile"]
        assert abs(sum(c["share"] for c in profile["categories"]) - 1) < 1e-6
        assert profile["top_ops"]
    for name in ("torchax", "flax"):  # jitted: XLA's figures
        assert rows[name]["flops"] > 0 and rows[name]["temp_bytes"] > 0 and rows[name]["compile_s"] > 0
        assert rows[name]["max_abs_err"] <= 2e-5  # fp32 parity, as the parity tests
        assert any(c["category"] == "convolution" for c in rows[name]["profile"]["categories"])
    assert rows["torch"]["flops"] is None and rows["torch"]["compile_s"] is None
    assert rows["torch"]["max_abs_err"] == 0  # the reference is upstream fp32 itself
    assert rows["torchax"]["time_vs_ours"] == 1 and rows["torch"]["time_vs_ours"] > 0
    assert report["peak_tflops"] > 0 and "measured" in report["peak_source"]


def test_bench_sweep_plot_and_warm_start(tmp_path):
    png = tmp_path / "sweep.png"
    report = _bench(
        "--shape", "1,4,4", "--systems", "torchax", "--repeats", "1", "--no-reference",
        "--sweep", "frames", "--sweep-values", "1,2", "--plot", str(png), "--cold-warm",
    )  # fmt: skip
    assert [(r["system"], r["shape"][2]) for r in report["results"]] == [("torchax", 1), ("torchax", 2)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = report["results"][0]  # the first shape also ran in two fresh processes
    assert first["cold_cache_misses"] >= 1  # the first process compiled ...
    assert first["warm_cache_misses"] == 0 and first["warm_cache_hits"] >= 1  # ... the second loaded it
    assert first["cold_first_frame_s"] > 0 and first["warm_first_frame_s"] > 0


def test_bench_compile_only_runs_nothing():
    report = _bench("--shape", "1,4,5,8,8", "--compile-only", "--cpu-memory-scheduler", "--systems", "torchax,torch")
    assert [r["system"] for r in report["results"]] == ["torchax"]
    ours = report["results"][0]
    assert ours["temp_bytes"] > 0 and ours["steady_s"] is None and ours["flops"] > 0
    assert "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED" in report["xla_flags"]


def test_wall_time_goes_to_the_running_op_or_the_last_to_end():
    from bench.profile import wall_time_by_op

    # a runs 0-10, then nothing until b starts at 20 (a's worker threads on
    # XLA:CPU); c starts inside b and is charged while it runs.
    charged = wall_time_by_op([(0, 10, "a"), (20, 30, "b"), (25, 27, "c"), (28, 29, "c")])
    assert charged == {"a": (20, 1), "b": (7, 1), "c": (3, 2)}
    assert sum(ns for ns, _ in charged.values()) == 30  # the whole span, nothing twice
