"""Three classes of hostile input, each closed as a whole class for both commands, not case by case.

1. An entry under an input's name that cannot be read as one (a folder named
   ``x.safetensors``, a link to a folder, a link that leads nowhere or loops,
   a FIFO, a socket, a file without read permission) is named on stderr and
   failed, never passed over: decode ``--output-dir`` exits 4 with the others
   written; encode, whose frames make one video, exits 2.
2. Any name its folder takes (NAME_MAX: 255 bytes, UTF-8 counted in bytes) is
   a legal output for every kind (mp4, PNG folder, npy, safetensors, streamed
   or not, named by the user or after an input): its staged temporary fits
   beside it. A longer name is refused before decoding.
3. Names that are not UTF-8 (Linux bytes such as ``b"\\xff"``) are read and
   written by their bytes; messages and summaries print them without failing
   (pytest's captured stdout is strict UTF-8, as a terminal's can be).

In-process runs at the tiny config, except where a real process is the point:
the unreadable file, read by a process without root's permission override
(``setpriv``), so that ``chmod 000`` holds when the tests run as root too.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import load_file
from safetensors.torch import save_file

from cogvideox_torchax.cli import jobs
from cogvideox_torchax.decode import main as decode
from cogvideox_torchax.encode import main as encode
from cogvideox_torchax.io import outputs, video

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]


def _z(shape=(1, 4, 1, 2, 2), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _b(path: Path | str, name: bytes) -> Path:
    """``path / name`` for a name given as bytes (not UTF-8 where the test says so)."""
    return Path(path) / os.fsdecode(name)


def _names(folder: Path) -> list[bytes]:
    return sorted(os.listdir(os.fsencode(folder)))


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the socket's entry stays after it closes


def _socket_at(path: Path) -> None:
    """A socket's entry at ``path``, however long (a socket's own address is at most 107 bytes): made short, moved."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        _socket(Path(short) / "s")
        os.replace(Path(short) / "s", path)


def _unprivileged(path: Path) -> list[str]:
    """A command prefix under which ``path`` (mode 000) cannot be read, as root too; skips where none exists."""
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: no way to make a file unreadable here")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--"]
    probe = subprocess.run([*prefix, sys.executable, "-c", f"open({str(path)!r}, 'rb')"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("chmod 000 does not stop reads here (root's override could not be dropped)")
    return prefix


# -- 1. entries that look like inputs but cannot be read ---------------------------


def _hostile_folder(folder: Path) -> set[str]:
    """``folder`` with one good latents file and every kind of entry that cannot be read as one; their names."""
    folder.mkdir()
    save_file({"latents": _z()}, folder / "good.safetensors")
    (folder / "dir.safetensors").mkdir()  # a folder, even one holding latents, is no latents file
    save_file({"latents": _z()}, folder / "dir.safetensors" / "inner.safetensors")
    (folder.parent / "elsewhere").mkdir()
    (folder / "to_dir.safetensors").symlink_to(folder.parent / "elsewhere")
    (folder / "dangling.safetensors").symlink_to(folder / "gone.safetensors")
    (folder / "loop.safetensors").symlink_to(folder / "loop.safetensors")
    os.mkfifo(folder / "fifo.safetensors")  # never opened: reading it would wait forever
    _socket(folder / "socket.safetensors")
    save_file({"latents": _z()}, folder / "unreadable.safetensors")
    (folder / "unreadable.safetensors").chmod(0)
    return {"dir", "to_dir", "dangling", "loop", "fifo", "socket", "unreadable"}


def test_every_entry_under_a_latents_name_that_cannot_be_read_is_named_and_failed(tmp_path):
    folder, out = tmp_path / "in", tmp_path / "out"
    bad = _hostile_folder(folder)
    # A folder and a pattern find every entry; each entry named alone (but a folder, whose latents it finds) is kept.
    everything = [folder / f"{n}.safetensors" for n in sorted(bad | {"good"})]
    assert jobs.expand_inputs([str(folder)]) == everything
    assert jobs.expand_inputs([str(folder / "*.safetensors")]) == everything
    files = [p for p in everything if p.stem not in ("dir", "to_dir")]
    assert jobs.expand_inputs([str(p) for p in files]) == files

    cmd = [sys.executable, "-m", "cogvideox_torchax.decode", str(folder), "--output-dir", str(out), "--format", "npy"]
    proc = subprocess.run([*_unprivileged(folder / "unreadable.safetensors"), *cmd, *TINY, "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4, proc.stderr  # some failed, the others written
    reasons = {Path(f["input"]).stem: f["error"] for f in json.loads(proc.stdout)["failed"]}
    assert set(reasons) == bad, proc.stderr
    for name, said in [("dir", "is a folder, not a latents file"), ("to_dir", "is a folder, not a latents file"),
                       ("dangling", "leads nowhere"), ("loop", "leads nowhere"), ("fifo", "not a regular file"),
                       ("socket", "not a regular file"), ("unreadable", "Permission denied")]:
        assert said in reasons[name], (name, reasons[name])
        assert f"failed: {str(folder / f'{name}.safetensors')!r}: " in proc.stderr, proc.stderr
    assert _names(out) == [b"good.npy"]


@pytest.mark.parametrize("kind", ["folder", "link-to-folder", "dangling", "loop", "fifo", "socket"])
def test_an_entry_under_a_frame_name_that_is_no_file_is_refused_not_skipped(tmp_path, capsys, kind):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(2):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    entry = folder / "2.png"
    {
        "folder": lambda: entry.mkdir(),
        "link-to-folder": lambda: entry.symlink_to(tmp_path),
        "dangling": lambda: entry.symlink_to(tmp_path / "gone.png"),
        "loop": lambda: entry.symlink_to(entry),
        "fifo": lambda: os.mkfifo(entry),
        "socket": lambda: _socket(entry),
    }[kind]()
    assert encode([str(folder), *TINY, "-o", str(tmp_path / "z.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().split("\n")[-1].startswith(f"error: frame {str(entry)!r} "), err
    assert not (tmp_path / "z.safetensors").exists()


@pytest.mark.parametrize("kind", ["fifo", "unreadable"])
def test_a_video_that_cannot_be_read_is_refused_without_waiting(tmp_path, kind):
    # A FIFO is never opened (the decoder would wait for a writer forever).
    path = tmp_path / "clip.mp4"
    if kind == "fifo":
        os.mkfifo(path)
        prefix = []
    else:
        video.encode_mp4(path, np.zeros((1, 16, 16, 3), np.uint8))
        path.chmod(0)
        prefix = _unprivileged(path)
    cmd = [sys.executable, "-m", "cogvideox_torchax.encode", str(path), "-o", str(tmp_path / "z.safetensors")]
    proc = subprocess.run([*prefix, *cmd, *TINY], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    said = "is not a regular file" if kind == "fifo" else "Permission denied"
    assert said in proc.stderr and str(path) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert _names(tmp_path) == [b"clip.mp4"]


def _model_folder(folder: Path, sharded: bool) -> Path:
    import cogvideox_torchax as ct

    ct.random_upstream("tiny").save_pretrained(folder, max_shard_size="20KB" if sharded else "10GB")
    return folder


# Each file the loader would open, by how it is found: named, by the index, the one found by its suffix.
_MODEL_ENTRIES = {
    "config": (False, lambda f: f / "config.json"),
    "weights": (False, lambda f: f / "diffusion_pytorch_model.safetensors"),
    "index": (True, lambda f: f / "diffusion_pytorch_model.safetensors.index.json"),
    "shard": (True, lambda f: sorted(f.glob("*-00001-of-*.safetensors"))[0]),
    "found-by-suffix": (False, lambda f: (f / "diffusion_pytorch_model.safetensors").rename(f / "w.safetensors")
                        or f / "w.safetensors"),
}


@pytest.mark.parametrize("kind", ["fifo", "socket", "folder", "dangling"])
@pytest.mark.parametrize("entry", list(_MODEL_ENTRIES))
def test_a_model_file_that_is_no_regular_file_is_refused_before_it_is_opened(tmp_path, capsys, entry, kind):
    """Exit 2 naming the entry, nothing written; a FIFO is never opened (its reader would wait for ever)."""
    import signal

    sharded, locate = _MODEL_ENTRIES[entry]
    path = locate(_model_folder(tmp_path / "model", sharded))
    path.unlink()
    {"fifo": lambda: os.mkfifo(path), "socket": lambda: _socket_at(path), "folder": lambda: path.mkdir(),
     "dangling": lambda: path.symlink_to(path.parent / "gone")}[kind]()
    latents = tmp_path / "z.safetensors"
    save_file({"latents": _z()}, latents)

    def waited(*_):
        raise TimeoutError(f"the loader opened the {kind} {path} and waited on it")

    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(60)
    try:
        code = decode([str(latents), "--model", str(tmp_path / "model"), "--mesh", "dp=1,tp=1", "--no-compile-cache",
                       "--output", str(tmp_path / "v.npy")])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    assert code == 2, err
    said = {"fifo": "not a regular file", "socket": "not a regular file", "folder": "is a folder",
            "dangling": "leads nowhere"}[kind]
    assert str(path) in err and said in err and "Traceback" not in err, err
    assert _names(tmp_path) == [b"model", b"z.safetensors"]  # nothing staged is left


def test_every_reader_looks_before_it_opens(tmp_path):
    """The readers under the commands, called alone: a FIFO is refused at once, never opened."""
    import signal

    from cogvideox_torchax.io import latents, model_files

    fifo = tmp_path / "x.safetensors"
    os.mkfifo(fifo)
    readers = [lambda: video.read_mp4(fifo), lambda: latents.check_header(fifo), lambda: latents.read_latents(fifo),
               lambda: model_files.read_state_dict(tmp_path)]

    def waited(*_):
        raise TimeoutError("a reader opened the FIFO and waited on it")

    previous = signal.signal(signal.SIGALRM, waited)
    try:
        for read in readers:
            signal.alarm(30)
            with pytest.raises(ValueError, match="not a regular file"):
                read()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- 2. output names of NAME_MAX bytes ------------------------------------------


def _longest(suffix: str, fill: str = "中") -> str:
    """A name of exactly 255 bytes ending in ``suffix``, mostly 3-byte UTF-8 characters (a cut may land in one)."""
    room = 255 - len(suffix.encode())
    name = fill * (room // len(fill.encode())) + "x" * (room % len(fill.encode())) + suffix
    assert len(name.encode()) == 255
    return name


def test_staged_names_fit_any_name_the_folder_takes_and_keep_every_promise(tmp_path):
    for suffix, is_dir in [(".mp4", False), (".safetensors", False), ("", True)]:
        path = tmp_path / _longest(suffix)
        with outputs.StagedOutputs([path]) as staged:
            tmp = staged.temps[0]
            assert tmp.parent == tmp_path and tmp.name.startswith(".") and tmp.is_dir() == is_dir
            assert len(os.fsencode(tmp.name)) <= 255 and tmp.name.endswith(suffix)
            tmp.name.encode("utf-8")  # a character cut short is dropped, never half kept
            staged.commit()
        assert _names(tmp_path) == [os.fsencode(path.name)]
        # Replaced under --overwrite (the old one moved aside under a bounded name too), nothing else left.
        with outputs.StagedOutputs([path], overwrite=True) as staged:
            staged.commit()
        assert _names(tmp_path) == [os.fsencode(path.name)]
        (shutil.rmtree if is_dir else os.unlink)(path)
        # Removed on failure or interrupt; an output that appears meanwhile is not replaced.
        with pytest.raises(KeyboardInterrupt), outputs.StagedOutputs([path]):
            raise KeyboardInterrupt
        assert _names(tmp_path) == []
        with outputs.StagedOutputs([path]) as staged:
            path.mkdir() if is_dir else path.write_bytes(b"theirs")
            with pytest.raises(outputs.OutputError, match="appeared while this command ran"):
                staged.commit()
        assert _names(tmp_path) == [os.fsencode(path.name)]
        (shutil.rmtree if is_dir else os.unlink)(path)
    # Two long names that share their first bytes are staged under two names.
    a, b = (tmp_path / _longest(f"{c}.npy") for c in "ab")
    assert outputs.staged_prefix(a, "", ".npy", 255) != outputs.staged_prefix(b, "", ".npy", 255)


@pytest.mark.parametrize("suffix", [".mp4", "", ".npy", ".safetensors"], ids=["mp4", "png", "npy", "safetensors"])
def test_decode_writes_every_output_kind_under_a_name_of_255_bytes(tmp_path, capsys, suffix):
    save_file({"latents": _z((1, 4, 2, 2, 2))}, tmp_path / "z.safetensors")
    out = tmp_path / _longest(suffix)
    assert decode([str(tmp_path / "z.safetensors"), "-o", str(out), *TINY, "--quiet"]) == 0, capsys.readouterr().err
    assert _names(tmp_path) == sorted([b"z.safetensors", os.fsencode(out.name)])  # no temporary left
    if suffix == ".mp4":
        assert video.read_mp4(out)[0].shape == (8, 16, 16, 3)  # 2 latent frames -> 8 (streamed)
    elif suffix == "":
        assert sorted(p.name for p in out.iterdir()) == [f"frame_{i:04d}.png" for i in range(8)]
    else:
        got = np.load(out) if suffix == ".npy" else load_file(out)["video"]
        assert got.shape == (3, 8, 16, 16) and np.isfinite(got).all()


def test_a_name_over_255_bytes_is_refused_before_decoding(tmp_path, capsys):
    save_file({"latents": _z()}, tmp_path / "z.safetensors")
    out = tmp_path / ("x" + _longest(".npy"))  # 256 bytes
    assert decode([str(tmp_path / "z.safetensors"), "-o", str(out), *TINY, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is too long: its name is 256 bytes, over its folder's 255" in err and err.count("\n") == 1, err
    out_dir = tmp_path / ("x" + _longest(""))
    assert decode([str(tmp_path / "z.safetensors"), "--output-dir", str(out_dir), *TINY, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "a name in it is longer than the 255 bytes a folder takes" in err and err.count("\n") == 1, err
    assert _names(tmp_path) == [b"z.safetensors"]


@pytest.mark.parametrize("kind", ["mp4", "safetensors"])
def test_outputs_named_after_inputs_of_255_bytes_are_written(tmp_path, capsys, kind):
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    one, two = _longest(".safetensors"), _longest(".safetensors", fill="é")
    save_file({"latents": _z((1, 4, 2, 2, 2))}, folder / one)
    save_file({"latents": _z((2, 4, 2, 2, 2), seed=1)}, folder / two)  # two videos: "<stem>_0", "<stem>_1"
    code = decode([str(folder), "--output-dir", str(out), "--format", kind, *TINY, "--json"])
    captured = capsys.readouterr()
    stem, pair = one[: -len(".safetensors")], two[: -len(".safetensors")]
    if kind == "mp4":  # streamed, 247 and 249 bytes
        assert code == 0, captured.err
        assert _names(out) == sorted(os.fsencode(n) for n in [f"{stem}.mp4", f"{pair}_0.mp4", f"{pair}_1.mp4"])
    else:  # "<stem>_0.safetensors" would be 257 bytes: that input fails when read, before decoding, named
        assert code == 4, captured.err
        failed = json.loads(captured.out)["failed"]
        assert [f["input"] for f in failed] == [str(folder / two)] and "257 bytes" in failed[0]["error"]
        assert _names(out) == [os.fsencode(one)]


def test_encode_writes_latents_under_a_name_of_255_bytes(tmp_path, capsys):
    video.encode_mp4(tmp_path / "clip.mp4", np.zeros((1, 16, 16, 3), np.uint8))
    out = tmp_path / _longest(".safetensors")
    assert encode([str(tmp_path / "clip.mp4"), "-o", str(out), *TINY, "--quiet"]) == 0, capsys.readouterr().err
    assert _names(tmp_path) == sorted([b"clip.mp4", os.fsencode(out.name)])
    assert load_file(out)["latents"].shape == (1, 1, 4, 2, 2)


# -- 3. names that are not UTF-8 -------------------------------------------------


def test_latents_under_names_that_are_not_utf8_decode_by_their_bytes(tmp_path, capsys):
    folder, out = tmp_path / "in", _b(tmp_path, b"out\xfe")
    folder.mkdir()
    z = _z((1, 4, 2, 2, 2))
    save_file({"latents": z}, folder / "good.safetensors")
    save_file({"latents": z}, _b(folder, b"\xff.safetensors"))
    bad = _b(folder, b"\xfa\xfb.safetensors")
    bad.write_bytes(b"not a safetensors file")
    # The human summary (not --json) on a strict UTF-8 stdout.
    code = decode([str(folder), "--output-dir", str(out), "--format", "npy", *TINY])
    captured = capsys.readouterr()
    assert code == 4 and "summary could not be printed" not in captured.err, captured.err  # only the bad file failed
    assert f"failed: {str(bad)!r}: " in captured.err, captured.err
    assert f"into {tmp_path}/out\\xfe " in captured.out, captured.out
    assert _names(out) == [b"good.npy", b"\xff.npy"]
    # Same latents, same program: the same bytes.
    np.testing.assert_array_equal(np.load(_b(out, b"\xff.npy")), np.load(out / "good.npy"))


def test_one_file_decode_and_encode_by_bytes(tmp_path, capsys):
    frames = _b(tmp_path, b"frames\xf0")
    frames.mkdir()
    for i, name in enumerate([b"0\xf1.png", b"1\xf2.png"]):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(_b(frames, name))
    z = _b(tmp_path, b"\xfe.safetensors")
    assert encode([str(frames), "-o", str(z), *TINY]) == 0, capsys.readouterr().err  # 1 frame of 2 (8k+1)
    said = capsys.readouterr().out
    assert f"encoded {tmp_path}/frames\\xf0 (2 frames 16x16" in said and "wrote " in said, said
    assert decode([str(z), "-o", str(_b(tmp_path, b"\xfd.mp4")), *TINY]) == 0, capsys.readouterr().err
    assert f"wrote {tmp_path}/\\xfd.mp4" in capsys.readouterr().out
    assert video.read_mp4(_b(tmp_path, b"\xfd.mp4"))[0].shape == (1, 16, 16, 3)
    assert _names(tmp_path) == [b"frames\xf0", b"\xfd.mp4", b"\xfe.safetensors"]
