"""The command lines never lose data, check every path first, and keep their exit codes.

In-process (``main(argv)``) with the tiny config wherever it can be; one
subprocess for a real Ctrl-C.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.cli import decode, encode, errors, out_of_memory, stages
from cogvideox_torchax.io import latents, video
from tests.support.files import tree

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache", "--quiet"]


def _z(shape=(1, 4, 2, 3, 4), seed=5):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.safetensors"
    save_file({"latents": _z()}, path)
    return str(path)


@pytest.fixture
def no_decode(monkeypatch):
    """Fails the test if the command gets as far as loading the model (the expensive work)."""

    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(stages, "load_stage", loaded)


def _refused(capsys, argv, message, main=decode.main, code=2):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert message in err, err
    return err


# -- 1. --overwrite never deletes a folder that is not ours -------------------


def test_overwrite_refuses_a_folder_with_other_files(tmp_path, capsys, good, no_decode):
    victim = tmp_path / "o" / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "notes.txt").write_text("precious")
    before = tree(tmp_path)
    _refused(capsys, [good, *TINY, "-o", str(victim), "--overwrite"], "never replaced, even with --overwrite")
    assert tree(tmp_path) == before


def test_overwrite_refuses_the_model_folder(tmp_path, capsys, good, no_decode):
    model = tmp_path / "model"
    ct.random_upstream("tiny").save_pretrained(model)
    before = tree(tmp_path)
    _refused(capsys, [good, *TINY, "-o", str(model), "--overwrite"], "'config.json'")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("output", [".", "..", "./"])
def test_overwrite_refuses_the_current_folder(tmp_path, capsys, good, monkeypatch, no_decode, output):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = tree(tmp_path)
    _refused(capsys, [good, *TINY, "-o", output, "--overwrite"], "current folder")
    assert tree(tmp_path) == before  # and no '..old.*' folder


def test_encode_overwrite_refuses_a_folder(tmp_path, capsys, no_decode):
    (tmp_path / "in").mkdir()
    (tmp_path / "z.safetensors").mkdir()
    (tmp_path / "z.safetensors" / "keep").write_text("x")
    before = tree(tmp_path)
    argv = [str(tmp_path / "in"), *TINY, "-o", str(tmp_path / "z.safetensors"), "--overwrite"]
    _refused(capsys, argv, "a file output never replaces a folder", main=encode.main)
    assert tree(tmp_path) == before


# -- 2. and 3. all outputs or none; nothing replaced that appears meanwhile ----


def test_a_file_that_appears_after_the_check_is_not_replaced(tmp_path, capsys, good, monkeypatch):
    real = video.write_video_to

    def and_someone_else_writes(dest, kind, one, **kw):
        real(dest, kind, one, **kw)
        (tmp_path / "v.npy").write_bytes(b"theirs")

    monkeypatch.setattr(video, "write_video_to", and_someone_else_writes)
    _refused(capsys, [good, *TINY, "-o", str(tmp_path / "v.npy")], "appeared while this command ran")
    assert (tmp_path / "v.npy").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.safetensors", "v.npy"]


def test_batch_whose_second_write_fails_leaves_no_video(tmp_path, capsys, monkeypatch):
    save_file({"z": _z((2, 4, 1, 2, 2))}, tmp_path / "b.safetensors")
    (tmp_path / "v_0.npy").write_bytes(b"old 0")  # replaced only if all succeed
    real, calls = video.write_video_to, []

    def second_fails(dest, kind, one, **kw):
        calls.append(dest)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(dest, kind, one, **kw)

    monkeypatch.setattr(video, "write_video_to", second_fails)
    before = tree(tmp_path)
    argv = [str(tmp_path / "b.safetensors"), *TINY, "-o", str(tmp_path / "v.npy"), "--overwrite"]
    _refused(capsys, argv, "the disk is full", code=1)
    assert len(calls) == 2 and tree(tmp_path) == before


@pytest.mark.parametrize("flags", [[], ["--no-stream"]], ids=["streamed", "whole"])
def test_interrupt_while_writing_leaves_nothing(tmp_path, capsys, monkeypatch, flags):
    save_file({"z": _z((2, 4, 1, 2, 2))}, tmp_path / "b.safetensors")
    real, calls = video.FrameWriter.write, []

    def interrupted(self, frames, tick=None):
        calls.append(self.dest)
        if len(calls) == 2:  # the second video (streamed: on the writer thread)
            raise KeyboardInterrupt
        real(self, frames, tick)

    monkeypatch.setattr(video.FrameWriter, "write", interrupted)
    before = tree(tmp_path)
    argv = [str(tmp_path / "b.safetensors"), *TINY, "-o", str(tmp_path / "frames"), *flags]
    _refused(capsys, argv, "interrupted", code=130)
    assert tree(tmp_path) == before


def test_interrupt_at_start_up(tmp_path, capsys, good, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(latents, "read_latents", interrupted)
    before = tree(tmp_path)
    _refused(capsys, [good, *TINY, "-o", str(tmp_path / "v.mp4")], "interrupted", code=130)
    assert tree(tmp_path) == before


def test_an_interrupt_swallowed_by_a_callback_still_ends_with_130(tmp_path, capsys, good, monkeypatch):
    # Python raises KeyboardInterrupt in whatever runs next, e.g. a garbage
    # collection callback of JAX's that swallows it ("Exception ignored in
    # _xla_gc_callback"; seen in test_signals_in_a_real_process): the run
    # must still stop before anything is moved in.
    real = video.write_video_to

    def swallowed(dest, kind, one, **kw):
        real(dest, kind, one, **kw)

        class Callback:
            def __del__(self):
                raise KeyboardInterrupt

        Callback()  # its __del__'s interrupt goes to sys.unraisablehook

    monkeypatch.setattr(video, "write_video_to", swallowed)
    before = tree(tmp_path)
    _refused(capsys, [good, *TINY, "-o", str(tmp_path / "v.npy")], "interrupted", code=130)
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("signals", "code", "said"),
    [
        ([signal.SIGINT], 130, "interrupted"),
        ([signal.SIGINT, signal.SIGINT], 130, "interrupted"),  # the second, 50 ms later, while cleaning up
        ([signal.SIGTERM], 143, "terminated (SIGTERM)"),
        ([signal.SIGHUP], 129, "hung up (SIGHUP)"),
    ],
    ids=["ctrl-c", "ctrl-c-twice", "sigterm", "sighup"],
)
def test_signals_in_a_real_process(tmp_path, good, signals, code, said):
    # Sent once the command's own code runs (the load bar is up): the
    # signal's exit code, one line, no traceback, nothing written.
    cmd = [sys.executable, "-m", "cogvideox_torchax.decode", good, "--model", "random:tiny", "--no-compile-cache"]
    proc = subprocess.Popen(
        [*cmd, "-o", str(tmp_path / "v.mp4")], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    err = ""
    deadline = time.monotonic() + 300
    while "load" not in err and time.monotonic() < deadline:
        err += proc.stderr.read(1)
    for i, signum in enumerate(signals):
        if i:
            time.sleep(0.05)
        proc.send_signal(signum)
    err += proc.communicate(timeout=300)[1]
    assert proc.returncode == code, err
    # (A signal in the middle of a progress bar's own write can leave that bar's line unfinished.)
    assert "Traceback" not in err and err.rstrip().endswith(f"error: {said}; nothing was written"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.safetensors"]


# -- 4. no silently wrong output ---------------------------------------------


def test_a_finite_value_that_overflows_the_decode_is_refused(tmp_path, capsys):
    z = _z()
    z[0, 1, 0, 1, 1] = 3e38  # finite in float32; the decode overflows to NaN
    save_file({"z": z}, tmp_path / "z.safetensors")
    before = tree(tmp_path)
    _refused(capsys, [str(tmp_path / "z.safetensors"), *TINY, "-o", str(tmp_path / "v.mp4")], "out of range for float32")
    assert tree(tmp_path) == before


def test_float64_latents_beyond_float32_are_out_of_range_not_inf(tmp_path, capsys, no_decode):
    z = _z().double()
    z[0, 0, 0, 0, 0] = 1e300
    save_file({"z": z}, tmp_path / "z.safetensors")
    err = _refused(capsys, [str(tmp_path / "z.safetensors"), *TINY, "-o", str(tmp_path / "v.mp4")], "1e+300")
    assert "out of range for float32" in err and "NaN" not in err


def test_unscaling_beyond_bfloat16_is_refused():
    z = np.full((1, 4, 1, 1, 1), 3.4e38, np.float32)  # float32 has it, bfloat16 (3.39e38) not
    with pytest.raises(latents.LatentsError, match="out of range for bfloat16"):
        latents.check_range(z, "bfloat16", unscaled_by=1.0)
    with pytest.raises(latents.LatentsError, match="overflow to Inf after dividing by the scaling factor 0.5"):
        with np.errstate(over="ignore"):
            latents.check_range(z * np.float32(2.0), "float32", unscaled_by=0.5)  # Inf
    latents.check_range(z, "float32")


def test_nonfinite_output_names_nan_weights(tiny_vae):
    class Vae:
        weights = {**tiny_vae.weights, "decoder.conv_in.conv.weight": jax.numpy.full((2,), jax.numpy.nan)}
        options = tiny_vae.options

    with pytest.raises(errors.UsageError, match="weight 'decoder.conv_in.conv.weight' holds NaN"):
        out_of_memory.check_finite(np.array([np.nan]), Vae(), "decode", 1.0)
    with pytest.raises(errors.UsageError, match=r"input \(largest \|value\| 3e\+38\) is out of range for float32"):
        out_of_memory.check_finite(np.array([np.inf]), tiny_vae, "decode", 3e38)
    out_of_memory.check_finite(np.zeros(3), tiny_vae, "decode", 1.0)


# -- 5. every path checked before the expensive work --------------------------


def test_unwritable_system_path_is_refused_before_decoding(tmp_path, capsys, good, no_decode):
    target = pathlib.Path("/proc/sys")
    if not target.is_dir():
        pytest.skip("no /proc/sys")
    _refused(capsys, [good, *TINY, "-o", str(target / "o.npy")], "is not writable")


def test_unusable_default_compile_cache_warns_and_runs(tmp_path, capsys, good, monkeypatch):
    (tmp_path / "home").write_text("a file, so no cache folder can be made under it")
    monkeypatch.delenv("COGVIDEOX_TORCHAX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(errors, "_warned", set())
    argv = [good, "--model", "random:tiny", "--mesh", "dp=1,tp=1", "-o", str(tmp_path / "v.npy"), "--json"]
    assert decode.main(argv) == 0
    out, err = capsys.readouterr()
    assert err.count("warning: cannot use the default compile cache") == 1, err
    assert json.loads(out)["compile_cache"] == "off"
    assert np.load(tmp_path / "v.npy").shape == (3, 8, 24, 32)


def test_unusable_compile_cache_option_is_bad_input(tmp_path, capsys, good, no_decode):
    (tmp_path / "file").write_text("")
    argv = [good, "--model", "random:tiny", "-o", str(tmp_path / "v.npy"), "--compile-cache", str(tmp_path / "file")]
    _refused(capsys, [*argv, "--quiet"], "pass another --compile-cache or --no-compile-cache")
    assert not (tmp_path / "v.npy").exists()


# -- exit codes ---------------------------------------------------------------


def test_out_of_memory_is_exit_3_naming_the_shape(tmp_path, capsys, good, monkeypatch):
    def exhausted(self, shape, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 96.00GiB.")

    # The streamed decode's compile falls back to the plan's, which fails the same way.
    monkeypatch.setattr(ct.TorchaxVAE, "stream_plan", exhausted)
    monkeypatch.setattr(ct.TorchaxVAE, "compile_decode", exhausted)
    before = tree(tmp_path)
    err = _refused(capsys, [good, *TINY, "-o", str(tmp_path / "v.mp4")], "out of memory", code=3)
    assert "shape (1, 4, 2, 3, 4)" in err and "96.00GiB" in err
    assert tree(tmp_path) == before


@pytest.mark.parametrize("main", [decode.main, encode.main], ids=["decode", "encode"])
def test_help_lists_the_exit_codes(capsys, main):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for line in ("0    success", "2    bad input", "3    out of memory", "4    decoding many", "5    the outputs were",
                 "130  interrupted", "143  terminated",
                 "129  hung up"):
        assert line in out
    assert main(["--no-such-option"]) == 2


def test_no_pickle_is_ever_loaded(tmp_path, capsys, good):
    # A model folder holding only a pickled checkpoint, whose unpickling would
    # leave a mark: refused, and never unpickled.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(ct.random_upstream("tiny").config))
    mark = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return (pathlib.Path.touch, (mark,))

    torch.save({"w": Payload()}, model / "diffusion_pytorch_model.bin")
    (model / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "diffusion_pytorch_model.bin"}})
    )
    argv = [good, "--model", str(model), "-o", str(tmp_path / "v.npy"), "--no-compile-cache", "--quiet"]
    assert decode.main(argv) == 2 and not mark.exists()
    assert "cannot read weights" in capsys.readouterr().err


def test_importing_the_commands_loads_no_framework():
    # The package resolves its public names lazily, so the command lines'
    # Ctrl-C handling is installed before torch, JAX or diffusers load.
    import subprocess
    import sys

    code = (
        "import sys, cogvideox_torchax.decode, cogvideox_torchax.encode, cogvideox_torchax as ct; "
        "heavy = [m for m in ('torch', 'jax', 'diffusers') if m in sys.modules]; "
        "assert not heavy, heavy; assert ct.RuntimeOptions().dtype == 'float32'; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(
    ("command", "argv", "message"),
    [
        ("decode", ["x.safetensors", "-o", "v.mp4", "--fps", "0"], "--fps must be a number from 0.01 to 1000"),
        ("decode", ["x.safetensors", "-o", "v.mp4", "--crf", "52"], "--crf must be a number from 0 to 51"),
        ("decode", ["x.safetensors", "-o", "v.mp4", "--seed", "-1"], "--seed must be a number"),
        ("decode", ["a", "--output-dir", "o", "--batch-size", "0"], "--batch-size must be a number at least 1"),
        ("decode", ["x.safetensors", "-o", "v.mp4", "--distributed-timeout", "0"], "--distributed-timeout"),
        ("encode", ["v.mp4", "-o", "z.safetensors", "--frames", "0"], "--frames must be a number at least 1"),
        ("encode", ["v.mp4", "-o", "z.safetensors", "--sample-seed", "-1"], "--sample-seed must be a number"),
        ("encode", ["v.mp4", "-o", "z.safetensors", "--target", "h100"], "--target plans for an accelerator"),
        ("decode", ["x.safetensors", "-o", "v.mp4", "--dtype", "int8"], "dtype must be float32, bfloat16 or float16"),
        ("encode", ["v.mp4", "-o", "z.safetensors", "--max-memory", "lots"], "--max-memory: memory budget must be"),
    ],
    ids=["fps", "crf", "seed", "batch-size", "timeout", "frames", "sample-seed", "target-without-dry-run", "dtype",
         "max-memory"],
)
def test_an_option_out_of_range_is_refused_before_any_framework_loads(tmp_path, command, argv, message):
    # In a fresh interpreter: after main() refused the option, neither torch
    # nor JAX nor diffusers was ever imported (the refusal takes milliseconds).
    code = (
        f"import sys; from cogvideox_torchax.cli import {command}; rc = {command}.main({argv!r}); "
        "heavy = [m for m in ('torch', 'jax', 'diffusers') if m in sys.modules]; print(rc, heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split("\n")[0] == "2 []", (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_mesh_larger_than_the_devices_is_refused_before_the_model_is_built(tmp_path, capsys, good, monkeypatch):
    def built(*a, **k):
        raise AssertionError("the model was built before the mesh was checked")

    monkeypatch.setattr(ct, "random_upstream", built)
    before = tree(tmp_path)
    err = _refused(capsys, [good, "--model", "random:tiny", "--mesh", "dp=64,tp=64", "--no-compile-cache", "-q",
                            "-o", str(tmp_path / "v.mp4")], "--mesh: mesh dp=64,tp=64 needs 4096 devices")
    assert "device(s) are available" in err
    assert tree(tmp_path) == before
