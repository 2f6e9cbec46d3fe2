"""The torch rows GPU users would pick (torch.compile, channels-last, both), measured by the bench on the CPU.

One in-process `bench.decode` run at the tiny config and one small shape,
shared by the tests that read its report; the rest is the report's
arithmetic and the isolation's bookkeeping on canned rows. Inductor's cold
compile of the tiny decoder (a C++ build per kernel) is most of the cost,
so the run compiles once: ``torch-compile-cl`` takes every step of
``bench_torch`` that ``torch-compile`` and ``torch-cl`` take.
``torch-compile`` alone runs in the heavy tier (`tests/test_bench.py`'s
every-system run, the quick suite).
"""

import contextlib
import copy
import io
import json

import pytest
import torch

from bench.systems import BY_NAME, TORCH_ROWS

ROWS = ("torch", "torch-cl", "torch-compile-cl")  # eager, channels-last, both switches: one inductor compile
SHAPE = [1, 4, 1, 2, 2]  # tiny's latents, one frame of 2x2


@pytest.fixture(scope="module")
def report(monkeypatch_module):
    """``bench.decode`` in this process: the torch rows of `ROWS` against upstream fp32, one steady call each."""
    from bench import decode

    monkeypatch_module.setattr("bench.peak.device_peak", lambda dtype: (1.0, "stub"))  # no 4096^3 matmul
    argv = ["--model", "random:tiny", "--shape", "1,2,2", "--systems", ",".join(ROWS), "--repeats", "1", "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert decode.main(argv) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_every_torch_row_decodes_as_upstream_fp32(report):
    rows = {r["system"]: r for r in report["results"]}
    assert list(rows) == list(ROWS) and report["isolated"] is False  # the CPU: one process
    assert rows["torch"]["max_abs_err"] == 0  # eager is the reference itself
    for name in ROWS[1:]:
        row = rows[name]
        assert row["shape"] == SHAPE and row["device"] == "cpu" and row["steady_s"] > 0, name
        # Inductor's fused kernels and the channels-last convolutions sum in another order: fp32 rounding.
        assert row["max_abs_err"] <= 2e-5 and row["mean_abs_err"] <= 1e-6, (name, row["max_abs_err"])
        assert row["flops"] is None and row["flops_source"] == "analytic" and row["tflops_per_s"] > 0


def test_a_compiled_rows_first_call_is_its_compile_time(report):
    rows = {r["system"]: r for r in report["results"]}
    for name in ROWS:
        row = rows[name]
        if BY_NAME[name].torch_compile:
            assert row["compile_s"] > 0 and row["compile_s"] == row["first_call_s"], name
            # Dynamo compiled the decoder whole: a graph at least, no break back to eager.
            assert row["torch_compile"]["graphs"] >= 1 and row["torch_compile"]["graph_breaks"] == 0, name
        else:
            assert row["compile_s"] is None and row["first_call_s"] > 0 and "torch_compile" not in row, name


def test_the_report_names_the_fastest_torch_row(report):
    rows = {r["system"]: r for r in report["results"]}
    (best,) = report["fastest_torch"]
    fastest = min(ROWS, key=lambda n: rows[n]["steady_s"])
    assert best == {"shape": SHAPE, "system": fastest, "steady_s": rows[fastest]["steady_s"], "ours_speedup": None}
    assert rows[fastest]["time_vs_fastest_torch"] == 1
    assert all(rows[n]["time_vs_fastest_torch"] >= 1 for n in ROWS)


def test_channels_last_puts_every_convolution_weight_in_its_ranks_layout(tiny_upstream):
    from bench.runners import channels_last

    module = copy.deepcopy(tiny_upstream)  # the session's module stays as it is
    # The module-wide conversion the rows' name suggests refuses the upsamplers' 2-D convolutions.
    with pytest.raises(RuntimeError, match="rank 5"):
        module.to(memory_format=torch.channels_last_3d)
    channels_last(module)
    moved = {5: 0, 4: 0}  # weights whose layout changed (a 1x1 kernel is both layouts at once)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            w = m.weight
            assert w.is_contiguous(memory_format={5: torch.channels_last_3d, 4: torch.channels_last}[w.dim()])
            moved[w.dim()] += not w.is_contiguous()
    assert moved[5] > 0 and moved[4] > 0  # both kinds: Conv3d everywhere, Conv2d in the upsamplers


def test_fastest_torch_skips_failed_rows_and_needs_ours_for_a_speedup():
    from bench.report import derive

    def rows(*timed):
        return [{"system": s, "shape": SHAPE, "steady_all_s": t} for s, t in timed]

    shape_rows = rows(("torchax", [1.0]), ("torch", [4.0]), ("torch-compile", [2.0, 3.0, 2.5]),
                      ("torch-cl", None), ("torch-compile-cl", [3.0]))  # fmt: skip
    shape_rows[3]["error"] = "torch.OutOfMemoryError: CUDA out of memory."
    best = derive(shape_rows, peak_tflops=None)
    assert best == {"shape": SHAPE, "system": "torch-compile", "steady_s": 2.5, "ours_speedup": 2.5}
    assert [r["time_vs_fastest_torch"] for r in shape_rows] == [0.4, 1.6, 1.0, None, 1.2]
    assert derive(rows(("torch-cl", [2.0]), ("torch", [3.0])), None)["ours_speedup"] is None  # no ours
    assert derive(rows(("torchax", [1.0]), ("flax", [2.0])), None) is None  # no torch row


def test_each_torch_row_is_a_process_of_its_own_and_the_pick_is_made_across_them(monkeypatch, capsys):
    from bench import decode, isolate

    steady = {"torchax": 1.0, "torch": 4.0, "torch-compile": 2.0, "torch-cl": 3.5, "torch-compile-cl": 1.6}
    asked = []

    def child(argv):  # a canned report per system, as one child process prints it
        name = argv[argv.index("--systems") + 1]
        asked.append(name)
        row = {"system": name, "shape": SHAPE, "steady_all_s": [steady[name]], "analytic_conv_flops": 1e9}
        # Each child picked among its own rows alone: the parent must not keep that pick.
        alone = {"shape": SHAPE, "system": name, "steady_s": steady[name], "ours_speedup": None}
        report = {"command": "c", "device": "d", "shape": SHAPE, "shapes": [SHAPE], "dtype": "bfloat16",
                  "plan": None, "peak_tflops": None, "peak_source": None, "results": [row], "isolated": False,
                  "fastest_torch": [alone] if name in TORCH_ROWS else []}  # fmt: skip
        return 0, report, ""

    monkeypatch.setattr(isolate, "_run_child", child)
    systems = ",".join(steady)
    assert decode.main(["--model", "random:tiny", "--shape", "1,2,2", "--systems", systems, "--isolate", "always",
                        "--json"]) == 0  # fmt: skip
    merged = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert asked == list(steady) and merged["isolated"] is True
    assert merged["fastest_torch"] == [{"shape": SHAPE, "system": "torch-compile-cl", "steady_s": 1.6,
                                        "ours_speedup": 1.6}]  # fmt: skip
    assert [r["system"] for r in merged["results"]] == list(steady)
