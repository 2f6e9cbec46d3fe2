"""Every numeric option's range, usage errors as one line, and outputs that may not be written, all before loading.

Each case exits 2 with one ``error:`` line naming the option, and the
model is never loaded (`stages.load_stage` fails the test if reached).
"""

import pytest
import torch
from safetensors.torch import save_file

from cogvideox_torchax.cli import decode, encode, stages


@pytest.fixture
def z(tmp_path):
    path = tmp_path / "z.safetensors"
    save_file({"latents": torch.zeros(1, 4, 1, 2, 2)}, path)
    return str(path)


@pytest.fixture(autouse=True)
def no_load(monkeypatch):
    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(stages, "load_stage", loaded)


def _one_line(capsys, main, argv, *needles):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("error: ") and "usage:" not in err, err
    for needle in needles:
        assert needle in err, err
    assert out == ""


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--fps", "1e-4"], ["--fps", "0.0001", "from 0.01 to 1000"]),
        (["--fps", "inf"], ["--fps", "inf"]),
        (["--fps", "nan"], ["--fps", "nan"]),
        (["--fps", "0"], ["--fps"]),
        (["--crf", "52"], ["--crf", "from 0 to 51"]),
        (["--crf", "1.5"], ["--crf", "invalid int value", "see --help"]),
        (["--seed", str(2**70)], ["--seed", str(2**70), "from 0 to 18446744073709551615"]),
        (["--seed", "-1"], ["--seed"]),
        (["--distributed-timeout", "0"], ["--distributed-timeout"]),
        (["--distributed-timeout", "inf"], ["--distributed-timeout"]),
        (["--max-memory", "-1GiB"], ["--max-memory"]),
        (["--max-memory", "0"], ["--max-memory"]),
        (["--mesh-typo", "x"], ["unrecognized arguments"]),
    ],
)
def test_decode_options_out_of_range_are_one_line(tmp_path, capsys, z, extra, needles):
    _one_line(capsys, decode.main, [z, "--model", "random:tiny", "-o", str(tmp_path / "o.mp4"), *extra], *needles)
    assert not (tmp_path / "o.mp4").exists()


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--batch-size", "0"], ["--batch-size", "at least 1"]),
        (["--batch-size", "-3"], ["--batch-size"]),
    ],
)
def test_decode_many_options_out_of_range_are_one_line(tmp_path, capsys, z, extra, needles):
    _one_line(capsys, decode.main, [z, "--model", "random:tiny", "--output-dir", str(tmp_path / "out"), *extra],
              *needles)


def test_an_output_never_replaces_its_input(tmp_path, capsys, z):
    before = (tmp_path / "z.safetensors").read_bytes()
    _one_line(capsys, decode.main, [z, "--model", "random:tiny", "-o", z, "--overwrite"], "never replaces an input")
    link = tmp_path / "link.safetensors"
    link.symlink_to(z)
    _one_line(capsys, decode.main, [z, "--model", "random:tiny", "-o", str(link), "--overwrite"], "never replaces")
    assert (tmp_path / "z.safetensors").read_bytes() == before


def test_a_trailing_slash_names_a_folder_not_a_file(tmp_path, capsys, z):
    _one_line(capsys, decode.main, [z, "--model", "random:tiny", "-o", str(tmp_path / "o.mp4") + "/"], "slash")
    assert list(tmp_path.iterdir()) == [tmp_path / "z.safetensors"]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--sample-seed", str(2**70)], ["--sample-seed", "from 0 to"]),
        (["--frames", "0"], ["--frames", "at least 1"]),
        (["--size", "16x20"], ["--size", "multiples of 8"]),
        (["--size=-8x8"], ["--size", "HEIGHTxWIDTH"]),
        (["--seed", "-5"], ["--seed"]),
    ],
)
def test_encode_options_out_of_range_are_one_line(tmp_path, capsys, extra, needles):
    video = tmp_path / "frames"
    video.mkdir()
    _one_line(capsys, encode.main, [str(video), "--model", "random:tiny", "-o", str(tmp_path / "z.safetensors"),
                                    *extra], *needles)


def test_encode_output_is_a_file_never_the_input(tmp_path, capsys):
    video = tmp_path / "in.safetensors"  # a frames folder of an odd name
    video.mkdir()
    _one_line(capsys, encode.main, [str(video), "--model", "random:tiny", "-o", str(video), "--overwrite"],
              "never replaces an input")
    _one_line(capsys, encode.main, [str(video), "--model", "random:tiny", "-o", str(tmp_path / "z.safetensors") + "/"],
              "slash")


def test_a_dry_run_refuses_the_outputs_the_run_would_refuse(tmp_path, capsys, z):
    existing = tmp_path / "o.npy"
    existing.write_bytes(b"mine")
    _one_line(capsys, decode.main, [z, "--model", "random:tiny", "-o", str(existing), "--dry-run"], "exists")
    video = tmp_path / "frames"
    video.mkdir()
    taken = tmp_path / "z2.safetensors"
    taken.write_bytes(b"mine too")
    _one_line(capsys, encode.main, [str(video), "--model", "random:tiny", "-o", str(taken), "--dry-run"], "exists")
    assert existing.read_bytes() == b"mine" and taken.read_bytes() == b"mine too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames", "o.npy", "z.safetensors", "z2.safetensors"]
