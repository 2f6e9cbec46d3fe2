"""`python -m bench.suite`: the standard set's commands, its JSON and results-page draft, its refusals."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import suite
from bench.suite_page import draft
from bench.suite_steps import STEPS, Step, step_systems
from bench.systems import SYSTEMS, TORCH_ROWS

ROOT = Path(__file__).resolve().parent.parent


def _listed(capsys, *argv: str) -> list[str]:
    assert suite.main(["--list", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_standard_set_is_the_h100_pages_commands(capsys):
    lines = _listed(capsys)
    assert len(lines) == len(STEPS)
    decode_2b, decode_15, parity, cold_warm, profile, stream, readme, decode_wan, decode_wan_720p, parity_wan = lines
    # Ours, the Flax port and every torch row GPU users would pick (issue 56), each in its own process on a GPU.
    assert decode_2b == (
        "python -m bench.decode --model random:cogvideox-2b --dtype bf16 --shape 13,60,90 "
        "--systems torchax,flax,torch,torch-compile,torch-cl,torch-compile-cl --repeats 3 --no-reference "
        "--isolate auto --json"
    )
    assert "--model random:cogvideox-1.5" in decode_15 and "--shape 21,96,170" in decode_15
    assert "--isolate auto" in decode_15 and "--systems torchax,flax,torch,torch-compile,torch-cl," in decode_15
    # Against upstream fp32 (no --no-reference), one process at its small shape; no torch.compile to wait for.
    assert "--shape 3,16,16" in parity and "--no-reference" not in parity and "--isolate never" in parity
    assert "--systems torchax,flax,torch " in parity
    assert "--cold-warm" in cold_warm and "--systems torchax " in cold_warm
    # One steady 2b call op by op, ours and eager torch, each in its own process on accelerators.
    assert profile == (
        "python -m bench.decode --model random:cogvideox-2b --dtype bf16 --shape 13,60,90 "
        "--systems torchax,torch --repeats 1 --no-reference --profile --isolate auto --json"
    )
    assert stream.startswith("python -m bench.stream") and "--systems whole,streamed,torch" in stream
    # The README's main command, as written there (its own dtype), with --json for the figures.
    assert readme.startswith(
        f"python -m cogvideox_torchax.decode {ROOT / 'examples' / 'latents_1x16x3x8x8.safetensors'} "
        "--model random:cogvideox-2b --output "
    )
    assert "--dtype" not in readme
    # Wan 2.1 at 480p x 81, ours against the torch rows (no Flax port), each in its own process on accelerators.
    assert decode_wan == (
        "python -m bench.decode --model random:wan2.1 --dtype bf16 --shape 21,60,104 "
        "--systems torchax,torch,torch-compile,torch-cl,torch-compile-cl --repeats 3 --no-reference --isolate auto "
        "--json"
    )
    assert (
        "--shape 21,90,160 --systems torchax,torch,torch-compile,torch-cl,torch-compile-cl --repeats 2 --no-reference "
        "--isolate auto" in decode_wan_720p
    )
    assert "--model random:wan2.1" in parity_wan and "--isolate never" in parity_wan
    readme_text = (ROOT / "README.md").read_text()
    assert "python -m cogvideox_torchax.decode examples/latents_1x16x3x8x8.safetensors" in readme_text


def test_systems_and_skips_trim_the_steps(capsys):
    lines = _listed(capsys, "--systems", "torch", "--skip", "parity-2b,readme", "--dtype", "float32")
    assert len(lines) == len(STEPS) - 2
    assert "--systems torch " in lines[0] and "--dtype float32" in lines[0]
    assert lines[2] == "# cold-warm-2b: skipped (none of its systems chosen)"
    assert "--systems torch " in lines[4]  # the stream's eager torch row alone
    assert _listed(capsys, "--only", "readme", "--quick")[0].startswith("python -m cogvideox_torchax.decode ")
    # --only keeps its own order (the most wanted first on a machine lent for minutes), once each.
    ordered = _listed(capsys, "--only", "parity-wan2.1,readme", "--only", "decode-2b,readme")
    assert [line.split()[2] for line in ordered] == ["bench.decode", "cogvideox_torchax.decode", "bench.decode"]
    assert "random:wan2.1" in ordered[0] and "random:cogvideox-2b --dtype bf16 --shape 13,60,90" in ordered[2]


def test_another_family_is_a_row_more_without_the_flax_port(monkeypatch, capsys):
    wan = Step("decode-wan", "decode", "wan2.1", "random:wan2.1", "5,8,8", family="wan")
    assert step_systems(wan, ("torchax", "flax", "torch")) == ("torchax", "torch")
    monkeypatch.setattr(suite, "STEPS", (*STEPS, wan))
    listed = _listed(capsys)[-1]
    assert "--model random:wan2.1 --dtype bf16 --shape 5,8,8 --systems torchax,torch,torch-compile,torch-cl," in listed


# The GPU run of issue 56 (15 minutes of an H200, machine start included): the torch rows and ours at 2b and
# Wan 720p first, then the 1.5 headline; docs/benchmarks.md states it.
GPU_RUN = ("--only", "decode-2b,decode-wan2.1-720p,decode-1.5",
           "--systems", "torchax,torch,torch-compile,torch-cl,torch-compile-cl")  # fmt: skip


def test_the_gpu_run_measures_the_torch_rows_at_2b_and_wan_720p_first(capsys):
    lines = _listed(capsys, *GPU_RUN)
    assert [line.split("--model ")[1].split(" --shape ")[1].split()[0] for line in lines] == [
        "13,60,90", "21,90,160", "21,96,170"]  # fmt: skip
    for line in lines:  # each system in its own process on the GPU; no Flax port in these minutes
        assert "--systems torchax,torch,torch-compile,torch-cl,torch-compile-cl " in line and "--isolate auto" in line
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "python -m bench.suite " + " ".join(GPU_RUN) in docs


def test_the_draft_names_the_fastest_torch_row_and_ours_against_it():
    rows = [
        {"system": s, "shape": [1, 16, 13, 60, 90], "steady_s": t, "steady_all_s": [t], "time_vs_ours": t / 0.93}
        for s, t in (("torchax", 0.93), ("torch", 2.16), ("torch-compile", 1.5), ("torch-compile-cl", 1.4))
    ]
    best = {"shape": [1, 16, 13, 60, 90], "system": "torch-compile-cl", "steady_s": 1.4, "ours_speedup": 1.4 / 0.93}
    report = {"shape": [1, 16, 13, 60, 90], "dtype": "bfloat16", "results": rows, "fastest_torch": [best]}
    record = {"name": "decode-2b", "kind": "decode", "label": "2b", "family": "cogvideox", "stdout_json": report}
    page = draft({"command": "c", "date": "d", "quick": False, "dtype": "bf16", "commit": "x", "versions": {},
                  "project": {}, "hardware": {}, "device": "gpu", "steps": [record]})  # fmt: skip
    header = next(line for line in page.splitlines() if line.startswith("| run |"))
    assert header == ("| run | ours | Flax port | eager torch | torch.compile | eager torch, channels-last | "
                      "torch.compile, channels-last |")  # fmt: skip
    line = next(line for line in page.splitlines() if line.startswith("| same, ours against the fastest torch row"))
    cells = [c.strip() for c in line.split("|")[2:-1]]
    assert cells == ["1.51x faster", "", "", "", "", "the fastest torch row (1.400 s)"]


def test_every_steps_family_is_its_models():
    from cogvideox_torchax import families

    for step in STEPS:
        for model in (step.model, step.quick_model):
            assert families.of_preset(model.removeprefix("random:")).name == step.family, (step.name, model)
    assert {s.family for s in STEPS} == {"cogvideox", "wan"}


def test_bad_steps_and_systems_are_one_line_and_exit_2(capsys):
    assert suite.main(["--only", "nope"]) == 2
    assert suite.main(["--systems", "jax"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "unknown steps ['nope']" in err[0] and "unknown systems ['jax']" in err[1]


def test_a_package_folder_without_its_kernels_is_refused(tmp_path, monkeypatch, capsys):
    """The source tree alone has its kernels (the link); a package folder that lost them is one line, exit 2."""
    assert suite.kernels_missing() is None
    (tmp_path / "cogvideox_torchax").mkdir()
    (tmp_path / "cogvideox_torchax" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cogvideox_torchax")
    line = suite.kernels_missing()
    assert line.startswith(f"error: {tmp_path / 'cogvideox_torchax'} holds no kernels/"), line
    assert suite.main(["--quick", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == line and not (tmp_path / "out").exists()


def test_a_step_past_its_timeout_is_ended_with_its_children():
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(p.pid, flush=True); time.sleep(120)"
    )
    record = suite.run_command(["-c", code], timeout_s=3)
    assert record["timed_out"] and record["wall_s"] < 60 and record["stdout_json"] is None
    grandchild = int(record["stdout_tail"].split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return  # ended and reaped
        if state == "Z":  # ended, its new parent not reaping it yet
            return
        time.sleep(0.2)
    os.kill(grandchild, 9)
    pytest.fail("the step's child outlived its timeout")


def _h100_15_report() -> dict:
    """The H100 run's 1.5 figures (../shared/results/h100-2026-11-27/b15-*.json), torch out of memory instead."""
    ours = {
        "system": "torchax", "shape": [1, 16, 21, 96, 170], "load_s": 2.14, "compile_s": 32.4997,
        "first_call_s": 37.9245, "steady_all_s": [5.3294, 5.3371], "steady_s": 5.33324, "temp_bytes": 18215987432,
        "argument_bytes": 257703942, "peak_device_bytes": 19673357312, "flops": 1223246479360.0,
        "analytic_conv_flops": 1567791407727616, "tflops_per_s": 293.966, "pct_of_peak": 29.7236, "time_vs_ours": 1.0,
    }  # fmt: skip
    torch = {"system": "torch", "shape": [1, 16, 21, 96, 170], "error": "torch.OutOfMemoryError: CUDA out of memory.",
             "returncode": 1}  # fmt: skip
    return {"shape": [1, 16, 21, 96, 170], "dtype": "bfloat16", "peak_tflops": 989.0, "results": [ours, torch],
            "device": "NVIDIA H100 80GB HBM3 x1 (gpu)"}  # fmt: skip


def test_the_draft_states_the_figures_and_every_failure():
    def record(name, kind, label, family="cogvideox", **rest):
        return {"name": name, "kind": kind, "label": label, "family": family, "command": f"python -m x {name}",
                "rc": 0, "wall_s": 1.0, "timed_out": False, **rest}  # fmt: skip

    steps = [
        record("decode-1.5", "decode", "1.5", rc=1, stdout_json=_h100_15_report(), error="exit code 1"),
        record("stream-2b", "stream", "2b", rc=None, timed_out=True, stdout_json=None, error="timed out after 600 s"),
        record("decode-wan", "decode", "wan2.1", family="wan", stdout_json=_h100_15_report()),
        {"name": "cold-warm-2b", "skipped": "none of its systems (torchax) chosen"},
        record("profile-2b", "profile", "2b", stdout_json=_profile_report()),
    ]
    page = draft({
        "command": "python -m bench.suite --out x", "date": "2026-11-27T11:44:51+00:00", "quick": False,
        "dtype": "bf16", "commit": "257cb93", "versions": {"jax": "0.11.2"}, "project": {"installed": "installed"},
        "hardware": {"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"], "cpu": "x", "cores": 16},
        "device": "NVIDIA H100 80GB HBM3 x1 (gpu)", "steps": steps,
    })  # fmt: skip
    assert page.startswith("# NVIDIA H100 80GB HBM3 x1 (gpu): the standard set (draft, 2026-11-27")
    assert "- Hardware: NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04" in page
    assert "python -m x decode-1.5  # decode-1.5" in page  # the commands once, at the top
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in page.splitlines() if line.startswith("| ")}
    # The results page's table, from the same JSON: ours, the Flax port, eager torch.
    assert rows["1.5, (1,16,21,96,170) bf16, steady (median of 2)"][0] == "5.333 s"
    assert rows["same, compile / first call"][0] == "32.5 / 37.9 s"
    assert rows["same, compiled temp / peak device"][0] == "16.96 / 18.32 GiB"
    assert rows["same, TFLOP/s (1568 TFLOP analytic)"][0] == "294 (29.7 % of 989)"
    assert rows["1.5, (1,16,21,96,170) bf16, steady (median of 2)"][2].startswith("failed: torch.OutOfMemoryError")
    assert rows["wan2.1, (1,16,21,96,170) bf16, steady (median of 2)"][1] == "CogVideoX only"
    assert rows["stream-2b: failed (timed out after 600 s)"]
    failures = page.split("## Failures")[1].split("##")[0]
    assert "- decode-1.5: exit code 1" in failures and "- stream-2b: timed out after 600 s" in failures
    assert "- decode-1.5, torch (exit code 1): torch.OutOfMemoryError: CUDA out of memory." in failures
    assert "- cold-warm-2b: none of its systems (torchax) chosen" in page.split("## Skipped")[1]
    # The profile: a row of shares in the table, each system's whole breakdown in its own section.
    profile = rows["per-op profile, 2b (1,16,13,60,90) bf16, one steady call"]
    assert profile[0] == "950 ms, 700 ms busy: convolution 80 %, elementwise 20 %"
    assert profile[2].rstrip(" |") == "2000 ms: convolution 100 %"  # the last column
    section = page.split("## Per-op profiles")[1].split("## Failures")[0]
    assert "### profile-2b, torchax: 950 ms from first op to last (700 ms of it with an op's event open)" in section
    assert "| `fusion.12` | convolution | 760.0 | 30 |" in section


def _profile_report():
    def breakdown(total, cats, **extra):
        return {
            "total_ms": total,
            **extra,
            "top_ops": [{"op": "fusion.12", "category": "convolution", "ms": 760.0, "count": 30}],
            "categories": [{"category": c, "ms": total * share, "share": share, "count": 1} for c, share in cats],
        }

    results = [
        {"system": "torchax", "shape": [1, 16, 13, 60, 90],
         "profile": breakdown(950.0, [("convolution", 0.8), ("elementwise", 0.2)], busy_ms=700.0)},
        {"system": "torch", "shape": [1, 16, 13, 60, 90], "profile": breakdown(2000.0, [("convolution", 1.0)])},
    ]  # fmt: skip
    return {"shape": [1, 16, 13, 60, 90], "dtype": "bfloat16", "results": results}


@pytest.mark.slow  # ten processes of torch and JAX, and inductor's cold compile of 2 torch.compile rows at 4 decodes
def test_quick_suite_writes_the_json_and_the_draft_with_every_step(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "suite.json").read_text())
    assert [s["name"] for s in report["steps"]] == [s.name for s in STEPS]
    for step in report["steps"]:
        assert step["rc"] == 0 and step["stdout_json"] and step["wall_s"] > 0 and not step.get("error"), step["name"]
        assert step["command"].startswith("python -m ")
    assert report["failures"] == [] and report["quick"] and report["device"]
    assert {"python", "jax", "torch", "torchax", "diffusers", "cogvideox-torchax"} <= set(report["versions"])
    assert report["commit"] and report["project"]["location"] and report["hardware"]["cores"]
    by_name = {s["name"]: s["stdout_json"] for s in report["steps"]}
    assert [r["system"] for r in by_name["decode-2b"]["results"]] == list(SYSTEMS)
    for name in ("decode-2b", "decode-1.5", "decode-wan2.1", "decode-wan2.1-720p"):  # every torch row, both families
        assert {r["system"] for r in by_name[name]["results"]} >= set(TORCH_ROWS), name
        assert by_name[name]["fastest_torch"][0]["system"] in TORCH_ROWS, name
    assert by_name["decode-2b"]["isolated"] is False  # the CPU: one process, as the CPU results were taken
    assert all(r["max_abs_err"] is not None for r in by_name["parity-2b"]["results"])
    assert by_name["cold-warm-2b"]["results"][0]["warm_cache_hits"] >= 1
    torch_row = next(r for r in by_name["stream-2b"]["rows"] if r["system"] == "torch")
    assert (torch_row["device"], torch_row["dtype"]) == ("cpu", "float32")  # no GPU: today's torch row
    page = (tmp_path / "results-draft.md").read_text()
    assert page == done.stdout
    for step in report["steps"]:
        assert f"{step['command']}  # {step['name']}" in page
    for what in ("steady (median of 1)", "max / mean abs", "first frame from the call, cold / warm",
                 "decode then write", "streamed (the command's default)", "README main command",
                 "ours against the fastest torch row"):  # fmt: skip
        assert what in page, what
    assert "## Failures\n\nNone." in page
