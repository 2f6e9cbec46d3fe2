"""A disk filling up while writing is one line naming the output, saying the disk is full and the bytes needed.

The writers are made to fail as a full disk makes them: ENOSPC or EDQUOT
from any writer, or numpy's short write (``N requested and M written``).
Exit codes stay: 1 for a single output, 4 in a many-latents run where
others were written; nothing partial stays.
"""

import errno

import pytest
import torch
from safetensors.torch import save_file

from cogvideox_torchax.cli import decode
from cogvideox_torchax.io import video
from tests.support.files import tree

TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache", "--quiet"]
FULL = {
    "enospc": (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
    "edquot": (OSError(errno.EDQUOT, "Disk quota exceeded"), "the quota is exceeded"),
    "numpy-short-write": (OSError("110592 requested and 16352 written"), "the disk is full"),
}


def _latents(folder, names):
    for i, name in enumerate(names):
        save_file({"z": torch.randn((1, 4, 2, 3, 4), generator=torch.Generator().manual_seed(i))},
                  folder / f"{name}.safetensors")


@pytest.mark.parametrize("case", sorted(FULL))
def test_a_full_disk_writing_one_output_is_named_with_exit_1(tmp_path, capsys, monkeypatch, case):
    error, said = FULL[case]
    _latents(tmp_path, ["a"])

    def full(dest, kind, one, **kw):
        dest.write_bytes(b"\0" * 10)  # a partial write first
        raise error

    monkeypatch.setattr(video, "write_video_to", full)
    before = tree(tmp_path)
    out = tmp_path / "v.npy"
    assert decode.main([str(tmp_path / "a.safetensors"), *TINY, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {said} writing {str(out)!r} ("), err
    assert "bytes needed" in err and "Traceback" not in err, err
    if case == "numpy-short-write":
        assert "110592 bytes needed, 16352 written" in err
    assert tree(tmp_path) == before  # no output, no temporary


def test_a_full_disk_in_a_many_latents_run_names_the_output_with_exit_4(tmp_path, capsys, monkeypatch):
    _latents(tmp_path, ["a", "b"])
    real = video.write_video_to

    def full_for_b(dest, kind, one, **kw):
        if dest.name.startswith(".b."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(dest, kind, one, **kw)

    monkeypatch.setattr(video, "write_video_to", full_for_b)
    out = tmp_path / "out"
    code = decode.main([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), *TINY,
                        "--output-dir", str(out), "--format", "npy"])
    assert code == 4
    err = capsys.readouterr().err
    assert f"the disk is full writing {str(out / 'b.npy')!r} (" in err and "bytes needed" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["a.npy"]
