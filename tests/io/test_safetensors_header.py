"""Safetensors headers not well formed by the format's rules are refused before any data is read.

Each case is a hand-made file: 8 bytes of header length, the JSON header,
the data. Well-formed files (one tensor, several, an empty one, metadata,
a header padded with spaces) are read.
"""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from cogvideox_torchax.cli import decode
from cogvideox_torchax.io import latents

F32 = {"dtype": "F32", "shape": [1, 4, 1, 1, 1], "data_offsets": [0, 16]}


def _file(path, header, data=b"\0" * 16, length=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        (b"", b"", 3, "shorter than the 8-byte header length"),  # (3 bytes of length: the file is 8 + 0)
        ({"z": F32}, b"\0" * 16, 10**6, "runs past the end of the file"),
        ({"z": F32}, b"\0" * 16, 2**63, "over the format's limit"),
        (b"\xff\xfe{}", b"", None, "not UTF-8 JSON"),
        (b"{\"z\": ", b"", None, "not UTF-8 JSON"),
        ([1, 2], b"", None, "a JSON list, not an object"),
        (b'{"z": %s, "z": %s}' % (json.dumps(F32).encode(), json.dumps(F32).encode()), b"\0" * 16, None,
         "names 'z' twice"),
        ({"__metadata__": {"a": 1}, "z": F32}, b"\0" * 16, None, "__metadata__ is not a map of strings to strings"),
        ({"__metadata__": ["a"], "z": F32}, b"\0" * 16, None, "__metadata__ is not a map"),
        ({"z": {"dtype": "F32", "shape": [4]}}, b"\0" * 16, None, "not {dtype, shape, data_offsets}"),
        ({"z": [1]}, b"\0" * 16, None, "not {dtype, shape, data_offsets}"),
        ({"z": {**F32, "dtype": "F33"}}, b"\0" * 16, None, "dtype 'F33', not one of the format's"),
        ({"z": {**F32, "shape": [1, -4, 1, 1, 1]}}, b"\0" * 16, None, "not a list of non-negative integers"),
        ({"z": {**F32, "shape": [1, 4.0, 1, 1, 1]}}, b"\0" * 16, None, "not a list of non-negative integers"),
        ({"z": {**F32, "data_offsets": [16, 0]}}, b"\0" * 16, None, "not [begin, end] with 0 <= begin <= end"),
        ({"z": {**F32, "data_offsets": [0]}}, b"\0" * 16, None, "not [begin, end]"),
        ({"z": {**F32, "data_offsets": [0, 12]}}, b"\0" * 12, None,
         "takes 16 bytes, but its data_offsets [0, 12] span 12"),
        ({"z": {**F32, "data_offsets": [0, 16]}}, b"\0" * 8, None, "need 16 bytes of data but the file holds 8"),
        ({"z": F32, "w": {**F32, "data_offsets": [8, 24]}}, b"\0" * 24, None, "overlaps the tensor before it"),
        ({"z": {**F32, "data_offsets": [4, 20]}}, b"\0" * 20, None, "leaves a hole of 4 bytes"),
        ({"z": F32}, b"\0" * 20, None, "4 bytes after the last tensor's data"),
    ],
    ids=[
        "short", "length-past-end", "length-over-limit", "not-utf8", "not-json", "not-an-object", "key-twice",
        "metadata-value", "metadata-kind", "entry-fields", "entry-kind", "dtype", "negative-dim", "float-dim",
        "offsets-order", "offsets-length", "size-mismatch", "data-short", "overlap", "hole", "trailing-bytes",
    ],
)
def test_a_malformed_header_is_refused_naming_the_file_and_the_fault(tmp_path, header, data, length, message):
    path = _file(tmp_path / "bad.safetensors", header, data, length)
    if length == 3:
        path.write_bytes(b"\x03\0\0")
    with pytest.raises(latents.LatentsError, match=r"is not a readable safetensors file \(malformed header\)") as e:
        latents.check_header(path)
    assert message in str(e.value) and str(path) in str(e.value), e.value
    with pytest.raises(latents.LatentsError, match=r"is not a readable safetensors file \(malformed header\)"):
        latents.read_latents(path)


def test_well_formed_files_are_read(tmp_path):
    save_file({"a": torch.zeros(0, 3), "b": torch.ones(2, dtype=torch.bfloat16), "z": torch.ones(1, 4, 1, 1, 1)},
              tmp_path / "several.safetensors", metadata={"format": "pt"})
    latents.check_header(tmp_path / "several.safetensors")
    assert latents.read_latents(tmp_path / "several.safetensors", "z").shape == (1, 4, 1, 1, 1)
    padded = json.dumps({"z": F32}).encode() + b"   "  # the format pads headers with spaces
    latents.check_header(_file(tmp_path / "padded.safetensors", padded, b"\0" * 16))
    assert latents.read_latents(tmp_path / "padded.safetensors").shape == (1, 4, 1, 1, 1)


def test_the_decode_command_refuses_a_malformed_header_with_exit_2(tmp_path, capsys):
    path = _file(tmp_path / "bad.safetensors", {"z": F32}, b"\0" * 20)
    out = tmp_path / "v.mp4"
    argv = [str(path), "--model", "random:tiny", "--no-compile-cache", "-q", "-o", str(out)]
    assert decode.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "bad.safetensors" in err, err
    assert "4 bytes after the last tensor's data" in err and not out.exists()


def test_model_weights_with_a_malformed_header_are_refused(tmp_path):
    from cogvideox_torchax.io import model_files

    _file(tmp_path / model_files.WEIGHTS_NAME, {"z": F32}, b"\0" * 20)
    with pytest.raises(model_files.ModelLoadError, match=r"cannot read weights: .*malformed header.*4 bytes after"):
        model_files.read_state_dict(tmp_path)
