"""The summary's timeline: parts that add up to the whole, imports by library, the import system left as it was."""

import importlib
import importlib._bootstrap
import pathlib
import sys
import types

import pytest

from cogvideox_torchax.cli import timeline

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _clock(python=0.5):
    t = timeline.Timeline("process start", python)
    t.entry, t.start = 100.0, 100.0 - python
    return t


def test_the_parts_add_up_to_the_total_and_an_import_counts_where_it_ran():
    t = _clock()
    t.stage("load", 101.0, 104.0)
    t.part("checks", 102.0, 102.5)
    t.part("weights", 102.5, 103.0)
    t.imports.spans.append((101.0, 101.5))  # an import inside the load stage
    t.imports.seconds = {"torch": 0.4, "ours": 0.1}
    t.stage("compile", 104.0, 106.0)
    got = t.breakdown(end=107.0)
    assert got["origin"] == "process start" and got["total_s"] == 7.5
    parts = got["parts_s"]
    assert parts == {"python": 0.5, "imports": 0.5, "model": 1.5, "checks": 0.5, "weights": 0.5, "compile": 2.0,
                     "other": 2.0}
    assert sum(parts.values()) == pytest.approx(got["total_s"])
    assert got["imports_s"] == {"torch": 0.4, "ours": 0.1}


def test_stages_that_overlap_share_their_time_and_parts_outside_stages_count():
    t = _clock(python=0.0)
    t.part("backend", 100.0, 100.25)
    t.stage("decode", 101.0, 104.0)
    t.stage("write", 101.5, 104.0)  # a streamed decode: written while it decodes
    parts = t.breakdown(end=104.0)["parts_s"]
    assert parts == {"python": 0.0, "imports": 0.0, "backend": 0.25, "decode": 0.5, "decode_write": 2.5,
                     "other": 0.75}


def test_imports_are_timed_by_library_and_the_import_system_is_restored(tmp_path, monkeypatch):
    # A library (named "torch" here) whose import takes 0.2 s and brings in a package of no named
    # library (0.1 s): the latter's time is the library's; a package imported on its own is "other".
    # The modules advance a stand-in clock instead of sleeping, so the figures are exact on any machine.
    now = [1000.0]
    clock_module = types.ModuleType("probe_clock")
    clock_module.advance = lambda s: now.__setitem__(0, now[0] + s)
    monkeypatch.setitem(sys.modules, "probe_clock", clock_module)
    monkeypatch.setattr(timeline, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    (tmp_path / "probe_lib.py").write_text("import probe_clock, probe_dep\nprobe_clock.advance(0.2)\n")
    (tmp_path / "probe_dep.py").write_text("import probe_clock\nprobe_clock.advance(0.1)\n")
    (tmp_path / "probe_alone.py").write_text("import probe_clock\nprobe_clock.advance(0.1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(timeline.LIBRARIES, "probe_lib", "torch")
    original = importlib._bootstrap._find_and_load
    with timeline.running(from_process_start=False) as clock:
        assert timeline.current() is clock
        import probe_lib  # noqa: F401
        importlib.import_module("probe_alone")
        clock_module.advance(0.5)  # the command's own work, outside any import
    assert importlib._bootstrap._find_and_load is original and timeline.current() is None
    for name in ("probe_lib", "probe_dep", "probe_alone"):
        sys.modules.pop(name)
    assert clock.imports.seconds == {"torch": pytest.approx(0.3), "other": pytest.approx(0.1)}
    assert len(clock.imports.spans) == 2  # two outermost imports
    got = clock.breakdown()
    assert got["origin"] == "main() call" and got["total_s"] == pytest.approx(0.9)
    assert got["parts_s"] == {"python": 0.0, "imports": pytest.approx(0.4), "other": pytest.approx(0.5)}


def test_the_process_age_is_read_from_the_process():
    age = timeline.process_age()
    if sys.platform.startswith("linux"):
        assert age is not None and 0 <= age < 24 * 3600
    else:
        assert age is None


def test_the_summary_lines():
    s = {"timeline": {"origin": "process start", "total_s": 3.0,
                      "parts_s": {"python": 0.1, "imports": 2.0, "decode_write": 0.5, "other": 0.4},
                      "imports_s": {"torch": 1.5, "ours": 0.5}}}
    assert timeline.lines(s) == [
        "  time from process start: 3.00 s = python 0.10 + imports 2.00 + decode and write 0.50 + other 0.40",
        "  imports: torch 1.50, ours 0.50 s",
    ]
    assert timeline.lines({}) == []


def test_a_command_reports_its_timeline_from_the_process_start(tmp_path):
    # The command as a process of its own, streaming an mp4: every part named, adding up to the whole.
    import json
    import os
    import subprocess

    import torch
    from safetensors.torch import save_file

    save_file({"latents": torch.zeros(1, 4, 2, 3, 4)}, tmp_path / "z.safetensors")
    argv = [tmp_path / "z.safetensors", "--model", "random:tiny", "--mesh", "dp=1,tp=1", "-o", tmp_path / "v.mp4",
            "--no-compile-cache", "--json"]
    done = subprocess.run([sys.executable, "-m", "cogvideox_torchax.decode", *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    t = json.loads(done.stdout)["timeline"]
    assert t["origin"] == "process start"
    parts = t["parts_s"]
    for name in ("python", "imports", "backend", "model", "checks", "weights", "wrap", "compile", "decode_write",
                 "other"):
        assert name in parts, parts
    assert sum(parts.values()) == pytest.approx(t["total_s"], abs=0.01)
    assert abs(parts["other"]) < 0.25 * t["total_s"], parts  # the parts named hold most of the run
    for library in ("torch", "jax", "torchax", "diffusers", "ours"):
        assert t["imports_s"][library] > 0, t["imports_s"]
    assert sum(t["imports_s"].values()) == pytest.approx(parts["imports"], abs=0.01)
