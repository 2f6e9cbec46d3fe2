"""``decode a b ... --output-dir DIR``: many latents in one run, bad ones reported and skipped, resumable.

In-process runs of the command with the tiny config; outputs are raw .npy
so they compare with the library decode of the same latents (fp32, 1e-5:
the program at batch 2 sums in another order than at batch 1).
"""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import cogvideox_torchax as ct
from cogvideox_torchax import batch
from cogvideox_torchax.decode import main
from tests.cli import assert_bad_input
from tests.parity import assert_close

TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]
SCALING = 1.15258426  # the tiny config's scaling factor


def _z(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def library():
    vae = ct.wrap(ct.random_upstream("tiny", seed=0), mesh="dp=1,tp=1")
    return lambda z: vae.decode(z / SCALING).sample.numpy()


def _inputs(folder):
    folder.mkdir()
    z = {f"v{i}": _z((1, 4, 3, 4, 6), seed=i) for i in range(3)}
    z["pair"] = _z((2, 4, 2, 4, 4), seed=9)  # two videos in one file, another shape
    for name, t in z.items():
        save_file({"latents": t}, folder / f"{name}.safetensors")
    (folder / "bad.safetensors").write_bytes(b"not a safetensors file")
    return z


def test_many_latents_batched_with_a_bad_file_skipped(tmp_path, capsys, library):
    z = _inputs(tmp_path / "in")
    out = tmp_path / "out"  # made by the command
    code = main([str(tmp_path / "in"), "--output-dir", str(out), "--format", "npy", "--batch-size", "2", *TINY, "--json"])
    captured = capsys.readouterr()
    assert code == 4, captured.err  # some failed, the others written
    summary = json.loads(captured.out)
    assert [f["input"] for f in summary["failed"]] == [str(tmp_path / "in" / "bad.safetensors")]
    assert "failed: " in captured.err and "bad.safetensors" in captured.err
    # One program per latent shape, at the batch size (the odd one out padded).
    assert summary["shapes"] == [[2, 4, 2, 4, 4], [2, 4, 3, 4, 6]]
    assert sorted(p.name for p in out.iterdir()) == ["pair_0.npy", "pair_1.npy", "v0.npy", "v1.npy", "v2.npy"]
    for name in ("v0", "v1", "v2"):
        assert_close(np.load(out / f"{name}.npy"), library(z[name])[0], atol=1e-5, label=name)
    pair = library(z["pair"])
    for i in range(2):
        assert_close(np.load(out / f"pair_{i}.npy"), pair[i], atol=1e-5, label=f"pair_{i}")


def test_skip_existing_resumes_and_leaves_outputs_alone(tmp_path, capsys):
    _inputs(tmp_path / "in")
    (tmp_path / "in" / "bad.safetensors").unlink()
    out = tmp_path / "out"
    argv = [str(tmp_path / "in" / "v*.safetensors"), "--output-dir", str(out), *TINY, "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    (out / "v1.mp4").unlink()  # as if interrupted before v1
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    assert main([*argv, "--skip-existing"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["written"] == [str(out / "v1.mp4")]
    assert sorted(summary["skipped"]) == [str(out / "v0.mp4"), str(out / "v2.mp4")]
    for name, seen in before.items():
        assert ((out / name).stat().st_mtime_ns, (out / name).read_bytes()) == seen
    # Without --skip-existing (or --overwrite) existing outputs are refused before decoding.
    assert_bad_input(main, tmp_path, capsys, argv, r"exists; pass --skip-existing")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["{in}/v0.safetensors", "{in}/v1.safetensors", "-o", "{tmp}/x.mp4"], "need --output-dir"),
        (["{in}/v0.safetensors", "-o", "{tmp}/x.mp4", "--batch-size", "2"], "--batch-size goes with --output-dir"),
        (["{in}", "--output-dir", "{tmp}/o", "--skip-existing", "--overwrite"], "contradict"),
        (["{in}", "--output-dir", "{tmp}/o", "--batch-size", "0"], "at least 1"),
        (["{in}/nothing*.safetensors", "--output-dir", "{tmp}/o"], "matches no file"),
        (["{in}/missing.safetensors", "--output-dir", "{tmp}/o"], "does not exist"),
        (["{in}", "{tmp}/other", "--output-dir", "{tmp}/o"], "would both write 'v0.mp4'"),
        (["{in}", "--output-dir", "{tmp}/no/such/o"], "parent folder does not exist"),
    ],
)
def test_bad_many_latents_arguments_write_nothing(tmp_path, capsys, extra, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "other").mkdir()
    for folder in ("in", "other"):
        save_file({"latents": _z((1, 4, 1, 2, 2), seed=0)}, tmp_path / folder / "v0.safetensors")
    save_file({"latents": _z((1, 4, 1, 2, 2), seed=1)}, tmp_path / "in" / "v1.safetensors")
    argv = [a.format(tmp=tmp_path, **{"in": tmp_path / "in"}) for a in extra]
    assert_bad_input(main, tmp_path, capsys, [*argv, *TINY], message)


def test_expand_inputs_folders_patterns_and_duplicates(tmp_path):
    for name in ("b.safetensors", "a.safetensors", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    found = batch.expand_inputs([str(tmp_path), str(tmp_path / "a.safetensors"), str(tmp_path / "?.safetensors")])
    assert [p.name for p in found] == ["a.safetensors", "b.safetensors"]  # sorted, each once, no .txt


def test_batches_group_equal_shapes_in_order():
    items = [batch.Item(f"{i}", 0, f"o{i}", (1, 4, 2 + i % 2, 2, 2)) for i in range(5)]
    runs = batch.batches(items, 2)
    assert [[it.source for it in run] for run in runs] == [["0", "2"], ["4"], ["1", "3"]]
    assert batch.output_name(batch.Path("x/clip.safetensors"), 1, 3, "png") == "clip_1"
