"""Fuzzing the command lines' bad-input contract.

Hypothesis generates, from a fixed seed (``derandomize=True``), malformed
latents files (safetensors headers and values), broken model configs and
output paths that must be refused. For each: ``main(argv)`` in-process exits
2 with exactly one ``error:`` line on stderr, writes nothing and changes
nothing that was there. Every case is refused before the model is compiled,
so the whole file runs in well under a minute on the tiny config.
"""

import contextlib
import io
import json
import os
import pathlib
import struct
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.cli import decode
from cogvideox_torchax.io import model_files

FUZZ = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TINY = ["--mesh", "dp=1,tp=1", "--no-compile-cache", "--quiet"]


def _tree(root: pathlib.Path) -> dict[str, object]:
    """Every entry under ``root``: a link's target, a folder, or a file's bytes."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = ("link", os.readlink(p))
        elif p.is_dir():
            out[key] = "dir"
        else:
            out[key] = p.read_bytes()
    return out


def _assert_refused(argv: list[str], sandbox: pathlib.Path, must_name: str | None = None) -> str:
    before = _tree(sandbox)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = decode.main(argv)
    text = err.getvalue()
    assert code == 2, (argv, code, text)
    assert text.count("\n") == 1 and text.startswith("error: ") and "Traceback" not in text, text
    if must_name is not None:
        assert must_name in text, text
    assert _tree(sandbox) == before, text  # nothing written, nothing changed, no temporary left
    return text


# -- malformed latents files --------------------------------------------------

GOOD_Z = torch.randn((1, 4, 2, 3, 4), generator=torch.Generator().manual_seed(0))
FLOATS = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
OTHER_DTYPES = ["I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL"]


def _file(header: object, data: bytes) -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text)) + text + data


def _entry(dtype: str, shape: list[int], start: int, end: int) -> dict:
    return {"z": {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}}


GOOD_DATA = GOOD_Z.numpy().tobytes()
GOOD_SHAPE = list(GOOD_Z.shape)


@st.composite
def bad_latents(draw) -> bytes:
    n = len(GOOD_DATA)
    kind = draw(
        st.sampled_from(
            ["length", "garbage", "dtype", "unknown_dtype", "shape", "offsets", "rank", "channels", "value", "f64",
             "truncated"]
        )
    )
    good = _file(_entry("F32", GOOD_SHAPE, 0, n), GOOD_DATA)
    if kind == "length":  # the header-length field lies
        true = struct.unpack("<Q", good[:8])[0]
        length = draw(st.integers(0, 2**64 - 1).filter(lambda v: v != true))
        return struct.pack("<Q", length) + good[8:]
    if kind == "garbage":  # a header that is not a safetensors header
        text = draw(st.binary(max_size=64))
        return struct.pack("<Q", len(text)) + text + draw(st.binary(max_size=16))
    if kind == "dtype":  # integers or booleans
        dtype = draw(st.sampled_from(OTHER_DTYPES))
        return _file(_entry(dtype, GOOD_SHAPE, 0, n), GOOD_DATA)
    if kind == "unknown_dtype":
        dtype = draw(st.text(max_size=6).filter(lambda d: d not in FLOATS and d not in OTHER_DTYPES))
        return _file(_entry(dtype, GOOD_SHAPE, 0, n), GOOD_DATA)
    if kind == "shape":  # data length and shape disagree
        shape = draw(st.lists(st.integers(-3, 9), min_size=1, max_size=6))
        assume(int(np.prod(shape)) * 4 != n or min(shape) < 0)
        return _file(_entry("F32", shape, 0, n), GOOD_DATA)
    if kind == "offsets":
        start, end = draw(st.tuples(st.integers(-2, n + 64), st.integers(-2, n + 64)))
        assume((start, end) != (0, n))
        return _file(_entry("F32", GOOD_SHAPE, start, end), GOOD_DATA)
    if kind == "rank":  # consistent, but not 5-D
        rank = draw(st.sampled_from([0, 1, 2, 3, 4, 6]))
        shape = {0: [], 1: [96], 2: [8, 12], 3: [4, 6, 4], 4: [4, 2, 3, 4], 6: [1, 4, 2, 3, 4, 1]}[rank]
        data = GOOD_DATA[: int(np.prod(shape)) * 4] if shape else GOOD_DATA[:4]
        return _file(_entry("F32", shape, 0, len(data)), data)
    if kind == "channels":  # 5-D, but no (or two) dims with the model's 4 channels, or an empty dim
        shape = draw(st.lists(st.integers(0, 5), min_size=5, max_size=5))
        assume((shape[1] == 4) == (shape[2] == 4) or 0 in shape)
        count = int(np.prod(shape))
        data = np.zeros(count, np.float32).tobytes()
        return _file(_entry("F32", shape, 0, len(data)), data)
    if kind == "value":  # NaN or Inf somewhere, in any float dtype
        dtype = draw(st.sampled_from(["F16", "BF16", "F32", "F64"]))
        torch_dtype = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}[dtype]
        z = GOOD_Z.to(torch_dtype, copy=True)  # a copy: F32 would otherwise poison GOOD_Z itself
        z.view(-1)[draw(st.integers(0, z.numel() - 1))] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
        data = z.view(torch.uint8).numpy().tobytes() if dtype == "BF16" else z.numpy().tobytes()
        return _file(_entry(dtype, GOOD_SHAPE, 0, len(data)), data)
    if kind == "f64":  # finite in float64, beyond float32's range
        z = GOOD_Z.to(torch.float64, copy=True)
        z.view(-1)[draw(st.integers(0, z.numel() - 1))] = draw(st.floats(3.5e38, 1e308)) * draw(st.sampled_from([1, -1]))
        data = z.numpy().tobytes()
        return _file(_entry("F64", GOOD_SHAPE, 0, len(data)), data)
    cut = draw(st.integers(0, len(good) - 1))  # truncated
    return good[:cut]


@FUZZ
@given(data=bad_latents())
def test_malformed_latents_are_refused(data):
    with tempfile.TemporaryDirectory() as d:
        sandbox = pathlib.Path(d)
        (sandbox / "z.safetensors").write_bytes(data)
        (sandbox / "exists.npy").write_bytes(b"keep")
        for out in ("o.npy", "exists.npy"):  # a new output, and an existing one under --overwrite
            argv = [str(sandbox / "z.safetensors"), "--model", "random:tiny", *TINY, "-o", str(sandbox / out)]
            _assert_refused([*argv, "--overwrite"] if out == "exists.npy" else argv, sandbox)


# -- broken model configs -----------------------------------------------------


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_model")
    ct.random_upstream("tiny", seed=0).save_pretrained(folder)
    latents_file = folder.parent / "fuzz_z.safetensors"
    save_file({"latents": GOOD_Z}, latents_file)
    return folder, latents_file


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(-2, 2), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
NOT_POSITIVE_INT = st.one_of(
    JUNK, st.integers(max_value=0), st.integers(min_value=2**31, max_value=2**80), st.floats(allow_nan=True)
)


def _power_of_two_up_to_8(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v in (1, 2, 4, 8)


BAD_VALUES = {
    "in_channels": NOT_POSITIVE_INT,
    "out_channels": NOT_POSITIVE_INT,
    "latent_channels": NOT_POSITIVE_INT,
    "layers_per_block": NOT_POSITIVE_INT,
    "norm_num_groups": NOT_POSITIVE_INT,
    "sample_height": NOT_POSITIVE_INT,
    "sample_width": NOT_POSITIVE_INT,
    "block_out_channels": st.one_of(
        JUNK.filter(lambda v: not (isinstance(v, list) and v and all(isinstance(c, int) and c > 0 and c % 2 == 0 for c in v))),
        st.just([]),
        st.lists(st.integers(-4, 0), min_size=1, max_size=4),
        st.lists(st.integers(0, 20).map(lambda c: 2 * c + 1), min_size=1, max_size=4),  # odd: not divisible by 2 groups
    ),
    "temporal_compression_ratio": st.one_of(
        JUNK, st.integers(-4, 64), st.floats(allow_nan=True, allow_infinity=True)
    ).filter(lambda v: not _power_of_two_up_to_8(v)),
    "scaling_factor": st.one_of(JUNK, st.floats(max_value=0), st.just(float("nan")), st.just(float("inf")), st.just(1e-320)),
    "norm_eps": st.one_of(JUNK, st.floats(max_value=0), st.just(float("nan")), st.just(float("inf"))),
    "shift_factor": st.one_of(st.text(max_size=4), st.just(float("nan")), st.just([1.0])),
    "act_fn": st.one_of(st.text(max_size=8).filter(lambda a: a not in model_files.ACT2CLS), st.integers(), st.none()),
    "down_block_types": st.one_of(
        JUNK, st.lists(st.sampled_from(["CogVideoXDownBlock3D", "DownBlock2D"]), max_size=6)
    ).filter(lambda v: v != ["CogVideoXDownBlock3D"] * 4),
    "up_block_types": st.one_of(JUNK, st.lists(st.sampled_from(["CogVideoXUpBlock3D", "UpBlock2D"]), max_size=6)).filter(
        lambda v: v != ["CogVideoXUpBlock3D"] * 4
    ),
    "use_quant_conv": st.one_of(st.integers(), st.text(max_size=3), st.none()),
    "invert_scale_latents": st.one_of(st.integers(), st.text(max_size=3), st.none()),
}


@FUZZ
@given(key=st.sampled_from(sorted(BAD_VALUES)), data=st.data())
def test_broken_configs_are_refused_naming_the_key(saved_tiny, key, data):
    folder, latents_file = saved_tiny
    value = data.draw(BAD_VALUES[key], label=key)
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    with tempfile.TemporaryDirectory() as d:
        sandbox = pathlib.Path(d)
        model = sandbox / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(config))
        (model / model_files.WEIGHTS_NAME).symlink_to(folder / model_files.WEIGHTS_NAME)
        argv = [str(latents_file), "--model", str(model), *TINY, "-o", str(sandbox / "o.mp4")]
        _assert_refused(argv, sandbox, must_name=f"'{key}'")


@FUZZ
@given(text=st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode)))
def test_unparsable_configs_are_refused(saved_tiny, text):
    folder, latents_file = saved_tiny
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        parsed = None
    assume(not isinstance(parsed, dict))  # any object could be a valid config
    with tempfile.TemporaryDirectory() as d:
        sandbox = pathlib.Path(d)
        model = sandbox / "model"
        model.mkdir()
        (model / "config.json").write_bytes(text)
        (model / model_files.WEIGHTS_NAME).symlink_to(folder / model_files.WEIGHTS_NAME)
        _assert_refused([str(latents_file), "--model", str(model), *TINY, "-o", str(sandbox / "o.npy")], sandbox)


# -- output paths that must be refused ------------------------------------------

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
SUFFIX = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=5).filter(
    lambda s: s not in ("mp4", "npy", "safetensors")
)


def _sandbox(root: pathlib.Path) -> None:
    (root / "z.safetensors").write_bytes(_file(_entry("F32", GOOD_SHAPE, 0, len(GOOD_DATA)), GOOD_DATA))
    (root / "exists.npy").write_bytes(b"keep")
    (root / "plain").write_bytes(b"a file without a suffix")
    (root / "victim" / "sub").mkdir(parents=True)
    (root / "victim" / "notes.txt").write_text("precious")
    (root / "frames").mkdir()
    (root / "frames" / "frame_0000.png").write_bytes(b"an old frame")
    (root / "dir.mp4").mkdir()
    (root / "link.npy").symlink_to(root / "exists.npy")
    (root / "cwd").mkdir()


@st.composite
def bad_outputs(draw) -> tuple[str, bool]:
    """(an output path relative to the sandbox, or absolute; whether --overwrite is given)."""
    kind = draw(st.sampled_from(["exists", "foreign", "suffix", "no_parent", "parent_file", "long", "system", "cwd"]))
    name = draw(NAME)
    if kind == "exists":  # without --overwrite, nothing existing is replaced
        return draw(st.sampled_from(["exists.npy", "plain", "victim", "frames", "dir.mp4", "link.npy"])), False
    if kind == "foreign":  # with it, still never a folder of other files, a link, or a folder for a file
        return draw(st.sampled_from(["victim", "dir.mp4", "link.npy", "cwd/..", "victim/..", "."])), True
    if kind == "suffix":
        return f"{name}.{draw(SUFFIX)}", draw(st.booleans())
    if kind == "no_parent":
        return f"missing/{name}.npy", draw(st.booleans())
    if kind == "parent_file":
        return f"exists.npy/{name}.{draw(st.sampled_from(['npy', 'mp4']))}", draw(st.booleans())
    if kind == "long":  # over NAME_MAX (255 bytes); up to it is a legal name (tests/contracts/test_hostile_inputs.py)
        return "x" * draw(st.integers(252, 400)) + ".npy", draw(st.booleans())
    if kind == "system":
        assume(pathlib.Path("/proc/sys").is_dir())
        return f"/proc/sys/{name}.npy", draw(st.booleans())
    return draw(st.sampled_from([".", "./", "..", "../cwd"])), True  # the current folder or one holding it


@FUZZ
@given(case=bad_outputs())
def test_bad_output_paths_are_refused_and_nothing_changes(case):
    out, overwrite = case
    with tempfile.TemporaryDirectory() as d:
        sandbox = pathlib.Path(d)
        _sandbox(sandbox)
        cwd = os.getcwd()
        os.chdir(sandbox / "cwd")
        try:
            target = out if out.startswith("/") else os.path.relpath(sandbox / out)
            if out in (".", "./", "..", "../cwd"):
                target = out
            argv = [str(sandbox / "z.safetensors"), "--model", "random:tiny", *TINY, "-o", target]
            _assert_refused([*argv, "--overwrite"] if overwrite else argv, sandbox)
        finally:
            os.chdir(cwd)
