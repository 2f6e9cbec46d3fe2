"""The benchmark harness runs end to end and reports what it promises (tiny config)."""

import json
import subprocess
import sys

import pytest

# The fields every result carries, null where a figure does not apply.
RESULT_KEYS = (
    "system",
    "load_s",
    "compile_s",
    "steady_s",
    "steady_all_s",
    "temp_bytes",
    "argument_bytes",
    "peak_device_bytes",
    "flops",
    "analytic_conv_flops",
    "flops_vs_analytic",
    "flops_source",
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


def _tiny_conv_flops(shape):
    """The analytic convolution FLOPs of the tiny decode, counted on real data."""
    import torch

    import cogvideox_torchax as ct
    from bench.flops import count_conv_flops

    return count_conv_flops(ct.random_upstream("tiny"), torch.randn(shape))[1]


def _check_rate(row):
    """The row's TFLOP/s divides the count its ``flops_source`` names (XLA's within 5 %, else analytic)."""
    xla, analytic = row["flops"], row["analytic_conv_flops"]
    close = xla is not None and abs(xla / analytic - 1) <= 0.05
    assert row["flops_source"] == ("xla" if close else "analytic"), row
    used = xla if close else analytic
    assert abs(row["tflops_per_s"] * row["steady_s"] * 1e12 / used - 1) < 1e-9


def test_bench_measures_all_three_systems_alike():
    """Every system by default: ours, the Flax port and every torch row (eager, torch.compile, channels-last)."""
    from bench.systems import BY_NAME, SYSTEMS, TORCH_ROWS

    report = _bench("--shape", "2,4,4", "--repeats", "2", "--profile")
    for key in ("device", "versions", "config", "shape", "dtype", "mesh", "commit", "plan", "fastest_torch"):
        assert key in report, key
    assert report["plan"] is None or isinstance(report["plan"], dict)
    assert report["shape"] == [1, 4, 2, 4, 4] and report["config"]["latent_channels"] == 4
    rows = {r["system"]: r for r in report["results"]}
    assert list(rows) == list(SYSTEMS)
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
    for name in TORCH_ROWS:  # upstream's module: no XLA count; a compile time where torch.compile runs
        assert rows[name]["flops"] is None and rows[name]["max_abs_err"] <= 2e-5, name
        if BY_NAME[name].torch_compile:
            assert rows[name]["compile_s"] == rows[name]["first_call_s"] > 0, name
        else:
            assert rows[name]["compile_s"] is None, name
    (best,) = report["fastest_torch"]
    assert best["system"] in TORCH_ROWS and best["ours_speedup"] == best["steady_s"] / rows["torchax"]["steady_s"]
    # One analytic count for the shape (the meta-device count equals the real one) ...
    conv_flops = _tiny_conv_flops((1, 4, 2, 4, 4))
    assert {r["analytic_conv_flops"] for r in rows.values()} == {conv_flops}
    for row in rows.values():  # ... and every rate says which count it divides
        _check_rate(row)
    assert rows["torch"]["flops_source"] == "analytic"  # no count of its own: the same work as ours
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
    # The analytic count needs no decode (meta device), so compile-only has it too.
    assert ours["analytic_conv_flops"] == _tiny_conv_flops((1, 4, 5, 8, 8))
    assert ours["flops_source"] in ("xla", "analytic") and ours["tflops_per_s"] is None
    assert "peak_device_bytes" in ours and "compile_s" in ours
    assert "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED" in report["xla_flags"]


def test_wall_time_goes_to_the_running_op_or_the_last_to_end():
    from bench.profile import wall_time_by_op

    # a runs 0-10, then nothing until b starts at 20 (a's worker threads on
    # XLA:CPU); c starts inside b and is charged while it runs.
    charged = wall_time_by_op([(0, 10, "a"), (20, 30, "b"), (25, 27, "c"), (28, 29, "c")])
    assert charged == {"a": (20, 1), "b": (7, 1), "c": (3, 2)}
    assert sum(ns for ns, _ in charged.values()) == 30  # the whole span, nothing twice


def test_gpu_library_calls_are_classed_by_their_target():
    from bench.profile import categorize
    from bench.runners import _torch_kind

    # XLA:GPU's convolutions and GEMMs are custom calls into cuDNN and cuBLAS (on the H100 run
    # they were 81 % of the decode, classed "other" before).
    hlo = "\n".join([
        "HloModule jit_decode, entry_computation_layout={()->()}",
        "ENTRY %main.1 (p: bf16[1,8,4,4,4]) -> bf16[1,8,4,4,4] {",
        "  %p = bf16[1,8,4,4,4]{4,3,2,1,0} parameter(0)",
        '  %cudnn-conv-bias-activation.3 = (bf16[1,8,4,4,4]{4,3,2,1,0}, u8[0]{0}) custom-call(%p, %w, %b), '
        'window={size=3x3x3}, custom_call_target="__cudnn$convBiasActivationForward"',
        '  %custom-call.7 = (bf16[64,64]{1,0}, s8[4194304]{0}) custom-call(%a, %c), '
        'custom_call_target="__cublas$lt$matmul"',
        '  %custom-call.9 = u8[4]{0} custom-call(), custom_call_target="SomethingElse"',
        '  %buffer_callback.4 = f32[1,8,4,4,4]{4,3,2,1,0} custom-call(%p, %w), '
        'custom_call_target="xla_buffer_python_cpu_callback"',
        "  ROOT %add.2 = bf16[1,8,4,4,4]{4,3,2,1,0} add(%p, %p)",
        "}",
    ])  # fmt: skip
    kinds = categorize(hlo)
    assert kinds["cudnn-conv-bias-activation.3"] == "convolution" and kinds["custom-call.7"] == "matmul"
    assert kinds["custom-call.9"] == "other" and kinds["add.2"] == "elementwise"
    assert kinds["buffer_callback.4"] == "convolution"  # kernels.host_conv, on the CPU
    # Eager torch's rows: aten ops by name; a runtime row is no matmul for the "mm" in "Command".
    assert _torch_kind("aten::cudnn_convolution") == "convolution" and _torch_kind("aten::addmm") == "matmul"
    assert _torch_kind("Command Buffer Full") == "other" and _torch_kind("aten::native_group_norm") == "reduction"


def test_busy_time_is_the_union_of_the_ops_intervals():
    from bench.profile import busy_ns

    # 0-10 and 5-12 overlap (12 ns), 20-30 holds 22-25: 22 ns busy in a 30 ns span.
    assert busy_ns([(20, 30, "b"), (0, 10, "a"), (5, 12, "c"), (22, 25, "d")]) == 22
    assert busy_ns([]) == 0


def test_meta_device_conv_count_equals_the_real_decode_count():
    import torch

    import cogvideox_torchax as ct
    from bench.flops import analytic_conv_flops, count_conv_flops, meta_twin

    upstream = ct.random_upstream("tiny")
    twin = meta_twin(upstream)
    assert all(p.device.type == "meta" for p in twin.parameters())
    # Odd sizes (padding at the edges), a batch of 2, latent frames beyond one frame batch.
    for shape in [(1, 4, 2, 4, 4), (2, 4, 3, 5, 7)]:
        sample, real = count_conv_flops(upstream, torch.randn(shape))
        assert sample.device.type == "cpu" and real > 0
        assert analytic_conv_flops(upstream, shape, twin) == real == analytic_conv_flops(upstream, shape)


def test_rate_uses_analytic_flops_when_xla_is_off_by_more_than_5_percent(capsys):
    from bench.report import derive, print_table

    analytic = 670e9
    rows = [
        # XLA on GPU: cuDNN convolutions count about nothing.
        {"system": "torchax", "shape": [1, 16, 3, 8, 8], "flops": 0.9e9, "steady_all_s": [2.0, 1.0, 3.0]},
        {"system": "flax", "shape": [1, 16, 3, 8, 8], "flops": 1.04 * analytic, "steady_all_s": [1.0]},
        {"system": "torch", "shape": [1, 16, 3, 8, 8], "flops": None, "steady_all_s": [0.5]},
    ]
    for row in rows:
        row["analytic_conv_flops"] = analytic
    derive(rows, peak_tflops=1.0)
    ours, flax, torch = rows
    assert ours["flops_source"] == "analytic" and ours["tflops_per_s"] == analytic / 2.0 / 1e12
    assert ours["flops"] == 0.9e9 and abs(ours["flops_vs_analytic"] - 0.9e9 / analytic) < 1e-12  # both kept
    assert flax["flops_source"] == "xla" and flax["tflops_per_s"] == 1.04 * analytic / 1e12
    assert torch["flops_source"] == "analytic" and torch["pct_of_peak"] == 100 * analytic / 0.5 / 1e12
    assert torch["flops"] is None and torch["compile_s"] is None and torch["peak_device_bytes"] is None
    # No analytic count at all: XLA's, and eager torch borrows ours (the same decode).
    bare = [dict(r, analytic_conv_flops=None) for r in rows[:1] + rows[2:]]
    derive(bare, peak_tflops=None)
    assert [r["flops_source"] for r in bare] == ["xla", "xla"] and bare[1]["tflops_per_s"] == 0.9e9 / 0.5 / 1e12

    report = {"command": "c", "commit": None, "device": "d", "mesh": {}, "dtype": "float32", "versions": {}}
    print_table({**report, "plan": {"steps": ["x"]}, "results": rows})
    out = capsys.readouterr().out
    assert "| rate from |" in out and "# plan {'steps': ['x']}" in out
    lines = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert "| analytic |" in lines["| torchax"] and "| xla |" in lines["| flax"]


def test_peak_device_bytes_is_only_a_systems_own(monkeypatch):
    from bench import runners

    cases = [  # peak before the system, after it; the row's peak and bound
        (None, None, None, None),  # no counter (XLA:CPU)
        (0, 50, 50, None),  # the first system
        (100, 200, 200, None),  # rose above an earlier system's peak: its own
        (100, 100, None, 100),  # did not: only a bound
    ]
    for before, after, own, at_most in cases:
        monkeypatch.setattr(runners, "_peak_device_bytes", lambda after=after: after)
        row = {}
        runners._own_peak(row, before)
        assert row["peak_device_bytes"] == own and row.get("peak_device_bytes_at_most") == at_most


def test_any_preset_in_presets_benches(monkeypatch, capsys):
    """Nothing in the bench names presets: a new entry in PRESETS is a valid ``random:`` model."""
    import json

    from bench import decode
    from cogvideox_torchax import config

    monkeypatch.setitem(config.PRESETS, "bench-test-preset", config.PRESETS["tiny"])
    argv = ["--model", "random:bench-test-preset", "--systems", "torch", "--shape", "1,2,2", "--repeats", "1"]
    assert decode.main([*argv, "--no-reference", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["config"]["model"] == "random:bench-test-preset"
    (row,) = report["results"]
    assert row["steady_s"] > 0 and row["analytic_conv_flops"] == _tiny_conv_flops((1, 4, 1, 2, 2))


# -- another model family (Wan): every command reads the family record ---------------


def test_bench_decodes_another_family_without_the_flax_port():
    import torch

    import cogvideox_torchax as ct
    from bench.flops import count_conv_flops

    # Ours, eager torch and the Flax port asked for (the torch.compile rows run on Wan in the quick suite).
    systems = "torchax,flax,torch"
    report = _bench("--model", "random:wan-tiny", "--shape", "2,4,4", "--repeats", "1", "--systems", systems)
    assert report["family"] == "wan" and report["shape"] == [1, 16, 2, 4, 4]  # z_dim, from the record
    # The Flax port is CogVideoX's decoder: not run, and the report says so.
    assert [r["system"] for r in report["results"]] == ["torchax", "torch"]
    assert "CogVideoX's decoder only" in report["not_run"]["flax"] and "Wan" in report["not_run"]["flax"]
    ours, torch_row = report["results"]
    assert ours["max_abs_err"] <= 1e-4 and torch_row["max_abs_err"] == 0
    assert ours["steady_s"] > 0 and torch_row["steady_s"] > 0 and ours["flops"] > 0
    real = count_conv_flops(ct.random_upstream("wan-tiny"), torch.randn(1, 16, 2, 4, 4))[1]
    assert ours["analytic_conv_flops"] == torch_row["analytic_conv_flops"] == real


def test_bench_decodes_a_timestep_conditioned_noise_injecting_vae_against_the_same_draws():
    # LTX-Video 0.9.1's tiny config: upstream's decode takes the decode timestep (0, as its pipelines pass it) and
    # injects noise from torch's generator; every compared call starts from the generator state the reference did.
    report = _bench("--model", "random:ltx-tiny", "--shape", "2,2,3", "--repeats", "1", "--systems", "torchax,torch")
    assert report["family"] == "ltx-video" and report["shape"] == [1, 8, 2, 2, 3]
    ours, torch_row = report["results"]
    assert ours["max_abs_err"] <= 1e-4 and torch_row["max_abs_err"] == 0
    assert ours["analytic_conv_flops"] == torch_row["analytic_conv_flops"] > 0


def test_a_flax_only_run_of_another_family_is_refused():
    import pytest

    from bench import decode

    with pytest.raises(SystemExit, match="no system to run: flax not run: the Flax port .* is CogVideoX's decoder"):
        decode.main(["--model", "random:wan-tiny", "--systems", "flax", "--shape", "1,2,2"])


def test_self_padding_convolutions_count_the_cache_not_the_zeros():
    """Wan's causal convolution pads itself (``_padding``): cache frames are real data, zero frames are not."""
    import torch
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    from bench.flops import count_conv_flops, valid_taps

    conv = WanCausalConv3d(2, 3, 3, padding=1)

    class Calls(torch.nn.Module):  # count_conv_flops calls decode: one conv call, then one with a cache
        def __init__(self):
            super().__init__()
            self.conv = conv

        def decode(self, x):
            self.conv(x)
            return type("Out", (), {"sample": self.conv(x, x[:, :, -1:])})

    x = torch.randn(1, 2, 2, 5, 4)
    _, total = count_conv_flops(Calls(), x)
    hw = valid_taps(5, 3, 1, 1, 1) * valid_taps(4, 3, 1, 1, 1)
    # No cache: 2 frames after 2 zero frames; a 1-frame cache: 3 frames after 1 zero frame.
    expected = 2 * 3 * 2 * hw * (valid_taps(2, 3, (2, 0), 1, 1) + valid_taps(3, 3, (1, 0), 1, 1))
    assert total == expected
    assert valid_taps(2, 3, (2, 0), 1, 1) == 1 + 2 and valid_taps(3, 3, (1, 0), 1, 1) == 2 + 3


def test_wan_conv_count_on_the_meta_device_equals_the_real_decode_count():
    import torch

    import cogvideox_torchax as ct
    from bench.flops import analytic_conv_flops, count_conv_flops

    for preset, shape in (("wan-tiny", (1, 16, 3, 4, 6)), ("wan-tiny", (2, 16, 1, 5, 3))):
        upstream = ct.random_upstream(preset)
        assert analytic_conv_flops(upstream, shape) == count_conv_flops(upstream, torch.randn(shape))[1] > 0


def test_compile_time_scans_another_familys_frames():
    done = subprocess.run(
        [sys.executable, "-m", "bench.compile_time", "--model", "random:wan-tiny", "--frames", "2,3", "--hw", "4,4",
         "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["mode"], r["latent_frames"]): r for r in json.loads(done.stdout.strip().splitlines()[-1])["rows"]}
    # Scanned: one program whatever the length (wan_frame_scan); unrolled: upstream's loop, one more frame.
    assert rows["scanned", 2]["program_lines"] == rows["scanned", 3]["program_lines"]
    assert rows["unrolled", 3]["program_lines"] > rows["unrolled", 2]["program_lines"]


def test_unrolled_turns_off_the_familys_own_loop_switches():
    from bench.inputs import loop_switches, unrolled_options

    assert {"frame_scan", "tile_batching"} <= set(loop_switches("cogvideox"))
    assert "wan_frame_scan" in loop_switches("wan") and "frame_scan" not in loop_switches("wan")
    assert "shard_activations" not in loop_switches("wan")  # every family's, not a loop
    options = unrolled_options("float32", "wan")
    assert options.switch("wan_frame_scan") is False and options.switch("frame_scan") is None


def test_a_local_folder_loads_as_its_familys_class(tmp_path):
    from diffusers import AutoencoderKLWan

    import cogvideox_torchax as ct
    from bench.inputs import family_of_model, latent_channels, load_upstream, video_channels

    ct.random_upstream("wan-tiny", seed=3).save_pretrained(tmp_path)
    assert family_of_model(str(tmp_path)).name == "wan"
    loaded = load_upstream(str(tmp_path), seed=0)
    assert type(loaded) is AutoencoderKLWan and latent_channels(loaded) == 16 and video_channels(loaded) == 3
    assert family_of_model("random:tiny").name == "cogvideox"


def test_lowered_describes_a_tpu_program_on_this_cpu():
    import cogvideox_torchax as ct
    from bench.lowered import describe

    report = describe(ct.random_upstream("tiny", seed=0), (1, 4, 3, 4, 4), "tpu", "bf16")
    assert report["plan"]["target"]["platform"] == "tpu" and report["plan"]["conv"]["bias"] == "after rounding"
    assert report["convolutions"] >= 10 and set(report["conv_dtypes"]) <= {"bf16->bf16", "f32->f32"}
    # The convolutions read and write at least what the unfused program's count holds for them.
    assert 0 < report["conv_io_bytes"] < report["xla_unoptimised_bytes"]
    assert report["analytic_conv_flops"] > 0


def test_targets_bench_compiles_ours_and_the_flax_port_for_a_gpu(tmp_path):
    from tests.support.compilers import require_compiler

    require_compiler("cuda")
    # Each system in its own process, compiled by the H200's compiler (~20 s).
    done = subprocess.run(
        [sys.executable, "-m", "bench.targets", "--target", "h200", "--shape", "1,4,3,8,16", "--model", "random:tiny",
         "--json", "--hlo-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["system"] for r in rows] == ["ours", "flax"]
    for r in rows:
        assert r["target"] == "h200" and r["per_device_bytes"]["temp"] > 0 and r["compile_s"] > 0
        assert r["build_s"] > 0 and r["trace_lower_s"] > 0
        assert r["compiled"]["convolutions"] >= 60
    ours, flax = (r["compiled"] for r in rows)
    # Ours: every conv NCDHW, as the GPU compiler keeps 3-D convs; the Flax
    # port's 2-D upsampler convs are NHWC.
    assert set(ours["conv_layouts"]) == {"bf012_oi012->bf012"} and len(flax["conv_layouts"]) > 1
    assert len(list(tmp_path.glob("*.hlo.txt"))) == 2


def test_targets_rows_name_the_exception_a_compile_died_of():
    from bench.targets import _error_line

    # JAX prints a note about its filtered traceback after the exception itself.
    stderr = ("Traceback (most recent call last):\n  File x\nRuntimeError: Input type (float) and bias type\n"
              "--------------------\nFor simplicity, JAX has removed its internal frames from the traceback\n")
    assert _error_line(stderr) == "RuntimeError: Input type (float) and bias type"
    assert _error_line("killed\n") == "killed" and _error_line("") == "(no output)"


# -- each system in its own process (--isolate) ---------------------------------------


def test_auto_isolates_where_jax_would_find_a_gpu_or_tpu(monkeypatch):
    from bench import isolate
    from cogvideox_torchax.platforms import accelerators

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    for visible in (True, False):
        monkeypatch.setattr(accelerators, "_accelerator_visible", lambda visible=visible: visible)
        assert isolate.wanted("auto") is visible
        assert isolate.wanted("always") and not isolate.wanted("never")
    monkeypatch.setattr(accelerators, "_accelerator_visible", lambda: True)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # told to use the CPU: one process
    assert not isolate.wanted("auto")
    # Each child: JAX's pool grows on demand (eager torch's process starts JAX too); a user's choice stays.
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    assert isolate.child_env()["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    assert isolate.child_env()["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def _stdout_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_isolated_report_has_the_in_process_structure(monkeypatch, capsys):
    import contextlib
    import io

    from bench import decode, isolate

    monkeypatch.setattr("bench.peak.device_peak", lambda dtype: (1.0, "stub"))  # no 4096^3 matmul per process
    children = []

    def child_here(argv):  # the child's command line, run in this process
        children.append(argv)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = decode.main(argv)
        return code, json.loads(out.getvalue().strip().splitlines()[-1]), ""

    monkeypatch.setattr(isolate, "_run_child", child_here)
    argv = ["--model", "random:tiny", "--shape", "1,2,2", "--systems", "torchax,torch", "--repeats", "1", "--json"]
    assert decode.main([*argv, "--isolate", "never"]) == 0
    together = _stdout_json(capsys)
    assert decode.main([*argv, "--isolate", "always"]) == 0
    apart = _stdout_json(capsys)
    assert [c[c.index("--systems") + 1 :][:3] for c in children] == [
        ["torchax", "--isolate", "never"],
        ["torch", "--isolate", "never"],
    ]
    assert together["isolated"] is False and apart["isolated"] is True
    assert set(apart) == set(together) and apart["plan"] == together["plan"]
    assert apart["command"].endswith("--isolate always") and apart["shapes"] == together["shapes"]
    pairs = list(zip(apart["results"], together["results"], strict=True))
    for a, b in pairs:
        assert (a["system"], a["shape"]) == (b["system"], b["shape"]) and set(a) == set(b)
    (ours, _), (torch, _) = pairs
    assert torch["time_vs_ours"] == torch["steady_s"] / ours["steady_s"]  # derived across the children
    assert torch["max_abs_err"] == 0 and ours["max_abs_err"] <= 2e-5  # each child has the reference


def test_a_system_whose_process_fails_is_a_row_of_its_own(monkeypatch, capsys):
    from bench import decode, isolate

    shape = [1, 4, 1, 2, 2]
    ours = {"system": "torchax", "shape": shape, "steady_all_s": [1.0], "analytic_conv_flops": 10.0, "flops": 10.0}
    report = {"command": "c", "device": "d", "shape": shape, "shapes": [shape], "dtype": "bfloat16", "plan": {"p": 1},
              "peak_tflops": 1.0, "peak_source": "s", "results": [ours], "isolated": False}  # fmt: skip

    def child(argv):
        if argv[argv.index("--systems") + 1] == "torch":
            return 1, None, "torch.OutOfMemoryError: CUDA out of memory."
        return 0, json.loads(json.dumps(report)), ""

    monkeypatch.setattr(isolate, "_run_child", child)
    argv = ["--model", "random:tiny", "--shape", "1,2,2", "--systems", "torchax,torch", "--isolate", "always"]
    assert decode.main([*argv, "--json"]) == 1  # the report still printed
    merged = _stdout_json(capsys)
    ours_row, torch_row = merged["results"]
    assert ours_row["steady_s"] == 1.0 and merged["plan"] == {"p": 1} and merged["isolated"] is True
    assert torch_row["error"] == "torch.OutOfMemoryError: CUDA out of memory." and torch_row["returncode"] == 1
    assert all(k in torch_row for k in RESULT_KEYS) and torch_row["shape"] == shape and torch_row["steady_s"] is None
    assert decode.main(argv) == 1
    assert "# torch failed (exit code 1): torch.OutOfMemoryError: CUDA out of memory." in capsys.readouterr().out


def test_isolate_runs_each_system_in_a_process_of_its_own():
    # Ours refuses the unknown switch in its own process; torch, in another, still runs.
    cmd = [sys.executable, "-m", "bench.decode", "--model", "random:tiny", "--shape", "1,2,2", "--systems",
           "torchax,torch", "--repeats", "1", "--no-reference", "--option", "no_such_patch=true", "--isolate",
           "always", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    ours, torch = report["results"]
    assert report["isolated"] is True and report["shape"] == [1, 4, 1, 2, 2]
    assert ours["error"].startswith("error: --option") and ours["shape"] == [1, 4, 1, 2, 2]
    assert torch["steady_s"] > 0 and "error" not in torch
    assert "[bench] torchax in its own process" in done.stderr  # the children's stderr passes through


def test_stream_torch_row_decodes_on_the_gpu_in_the_runs_dtype(monkeypatch):
    import torch

    from bench.stream import torch_placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch_placement("bf16") == ("cuda", "bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_placement("bf16") == ("cpu", "float32")  # the CPU: today's fp32 row


def test_targets_option_sets_a_switch_for_ours_and_plain_torchax_keeps_every_switch_off():
    from bench import targets

    assert targets._options("ours", ["wan_tail_chunks=true"]).switch("wan_tail_chunks") is True
    assert targets._options("ours", []).switch("wan_tail_chunks") is None
    assert targets._options("torchax", ["wan_tail_chunks=true"]).switch("wan_tail_chunks") is False
    with pytest.raises(SystemExit, match="expected NAME=true"):
        targets._options("ours", ["wan_tail_chunks=maybe"])
