"""SIGINT, SIGTERM and SIGHUP at randomised moments of real command processes.

Each command kind (one latent file; several latent shapes with
``--output-dir``; a long video streamed to mp4) runs once undisturbed to measure its duration and write
the reference outputs; then a few runs each get one signal at a seeded
random moment spread over that duration (import, load, each compile,
decode, write, commit, and after: the summary and the exit). Every one must
end with the signal's exit code and its one line, never by the signal
itself and never by a crash, and leave no partial output: an output is
either absent or equal to the reference, and no temporary entry stays.
A signal that finds the process already in its exit (os._exit called:
exit 0, whole outputs, ended within `LEAVING_S`) came after it.
"""

import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = [sys.executable, "-m", "cogvideox_torchax.decode", "--model", "random:tiny", "--mesh", "dp=1,tp=1",
        "--no-compile-cache", "--layout", "BCTHW"]
SAID = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
RUNS = 4  # signalled runs per command kind
EARLIEST_S = 0.5  # the interpreter itself starting up is not the command's
LEAVING_S = 0.3  # a run that ends this soon after its signal, with exit 0 and whole outputs, was already leaving


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("latents")
    g = torch.Generator().manual_seed(41)
    for t in (1, 2, 3):  # three latent shapes: three compiles in a many-latents run
        save_file({"z": torch.randn((1, 4, t, 4, 4), generator=g)}, folder / f"v{t}.safetensors")
    # Long enough that a streamed mp4 is being written while batches decode.
    save_file({"z": torch.randn((1, 4, 200, 4, 4), generator=g)}, folder / "long.safetensors")
    return folder


def _single(inputs, out: pathlib.Path) -> list[str]:
    return [*BASE, str(inputs / "v2.safetensors"), "-o", str(out / "v2.npy")]


def _streamed(inputs, out: pathlib.Path) -> list[str]:
    # PNG frames: whole outputs compare byte for byte (libx264's bytes may differ between runs on a busy machine).
    return [*BASE, str(inputs / "long.safetensors"), "-o", str(out / "long")]


def _many(inputs, out: pathlib.Path) -> list[str]:
    return [*BASE, *(str(inputs / f"v{t}.safetensors") for t in (1, 2, 3)), "--output-dir", str(out), "--format", "npy"]


def _files(folder: pathlib.Path) -> dict[str, object]:
    if not folder.exists():
        return {}
    return {p.name: _files(p) if p.is_dir() else p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(("kind", "argv"), [("single", _single), ("many", _many), ("streamed", _streamed)])
def test_a_signal_at_any_moment_ends_with_its_code_and_one_line(tmp_path, inputs, kind, argv):
    # Undisturbed: the duration to spread the signals over, and the outputs they may leave.
    reference = tmp_path / "reference"
    reference.mkdir()
    t0 = time.monotonic()
    done = subprocess.run(argv(inputs, reference), cwd=ROOT, capture_output=True, text=True, timeout=300)
    duration = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    expected = _files(reference)
    assert len(expected) == (3 if kind == "many" else 1), expected

    rng = random.Random(f"signals-{kind}")
    signums = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    for i in range(RUNS):
        # One moment in each of RUNS equal spans of the run (so every stage
        # gets its share), placed at random inside it.
        at = EARLIEST_S + (i + rng.random()) * (duration - EARLIEST_S) / RUNS
        signum = rng.choice(signums)
        out = tmp_path / f"run{i}"
        out.mkdir()
        start = time.monotonic()
        proc = subprocess.Popen(argv(inputs, out), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(max(0.0, start + at - time.monotonic()))
        sent = proc.poll() is None
        if sent:
            proc.send_signal(signum)
        sent_at = time.monotonic()
        _, err = proc.communicate(timeout=300)
        where = f"{kind} run {i}: {signal.Signals(signum).name} at {at:.2f} s of {duration:.2f} s"
        if sent and proc.returncode == 0 and time.monotonic() - sent_at < LEAVING_S:
            # Sent as the process was already leaving: the kernel keeps the code os._exit gave it (its
            # teardown takes 60-80 ms here). The moment just before os._exit is checked exactly by
            # `test_a_signal_as_the_process_leaves_is_its_exit_code_and_line`.
            assert _files(out) == expected, f"{where}: exit 0 with {sorted(_files(out))}"
            sent = False
        if not sent:  # it had finished: nothing to check but a clean run
            assert proc.returncode == 0, f"{where}\n{err}"
            continue
        assert proc.returncode == CODE[signum], f"{where}: exit {proc.returncode}\n{err}"
        assert "Traceback" not in err and "Fatal Python error" not in err, f"{where}\n{err}"
        last = err.rstrip("\n").split("\n")[-1]
        assert last.startswith(f"error: {SAID[signum]}; "), f"{where}\n{err}"
        left = _files(out)
        # No temporary entry stays; what is there is whole (equal to the undisturbed run's).
        assert all(not name.startswith(".") for name in left), f"{where}: {sorted(left)}"
        assert all(expected.get(name) == data for name, data in left.items()), f"{where}: {sorted(left)}"
        if kind != "many":
            said = "the outputs were already written" if left else "nothing was written"
            assert said in last, f"{where}\n{err}"
        elif left:  # (before the options are read, the line cannot know it is a many-latents run)
            assert "the videos already written stay" in last, f"{where}\n{err}"


def test_a_signal_during_an_import_is_raised_once_the_import_is_whole(tmp_path):
    # Raised inside an import, an interrupt can abort the process from native
    # code (torch's autograd init calls back into Python: SIGABRT) or leave a
    # half-imported numpy; so it waits for the outermost import to end. The
    # module here signals its own process halfway through its body. In a child
    # process: after a signal the handlers ignore further ones.
    (tmp_path / "signals_halfway.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGHUP)\nfor _ in range(10000):\n    pass\nwhole = True\n"
    )
    (tmp_path / "imported_while_cleaning_up.py").write_text("whole = True\n")
    # A second signal while the import holds the first raises at once: an import that hangs stays interruptible.
    (tmp_path / "hangs_after_a_signal.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nfor _ in range(10000):\n    pass\n"
        "os.kill(os.getpid(), signal.SIGINT)\nfor _ in range(10000):\n    pass\nwhole = True\n"
    )
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from cogvideox_torchax.cli import interrupts\n"
        "with interrupts.handled():\n"
        "    try:\n"
        "        import signals_halfway\n"
        "        print('not raised')\n"
        "    except interrupts.Terminated as e:\n"
        "        print('raised', e.code, getattr(sys.modules.get('signals_halfway'), 'whole', False))\n"
        "    import imported_while_cleaning_up  # the signal was raised already: not again\n"
        "    print('cleaned up', imported_while_cleaning_up.whole)\n"
        "with interrupts.handled():\n"
        "    try:\n"
        "        import hangs_after_a_signal\n"
        "        print('not raised')\n"
        "    except KeyboardInterrupt as e:\n"
        "        print('raised', type(e).__name__, 'hangs_after_a_signal' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["raised 129 True", "cleaned up True", "raised KeyboardInterrupt False"], (
        done.stdout + done.stderr
    )


def test_a_signal_as_the_process_leaves_is_its_exit_code_and_line():
    # The randomised runs above once sent SIGTERM as a finished command left (exit 0, no line): either
    # between `leave`'s last look and os._exit, or in the exit itself (which no process can see). Here
    # it comes at the first moment by construction: blocked, then sent, so that only a look at the
    # pending signals can see it.
    code = (
        "import os, signal, sys\n"
        "from cogvideox_torchax.cli import interrupts\n"
        "with interrupts.handled(keep=True):\n"
        "    print('done', flush=True)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "interrupts.leave(0, lambda e: print('error: terminated', e.code, file=sys.stderr))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (143, "done\n", "error: terminated 143\n")
