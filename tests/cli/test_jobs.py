"""``decode a b ... --output-dir DIR``: many latents in one run, bad ones reported and skipped, resumable.

In-process runs of the command with the tiny config; outputs are raw .npy
so they compare with the library decode of the same latents (fp32, 1e-5:
the program at batch 2 sums in another order than at batch 1).
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.cli import jobs
from cogvideox_torchax.decode import main
from tests.support.cli import assert_bad_input
from tests.support.parity import assert_close

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
    # The run's time in parts that add up to it: each shape's compile apart from the decode around it.
    t = summary["timeline"]
    assert {"compile", "decode"} <= set(t["parts_s"])
    assert sum(t["parts_s"].values()) == pytest.approx(t["total_s"], abs=0.01)
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


def test_outputs_that_clash_or_replace_inputs_are_refused(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    save_file({"latents": _z((2, 4, 1, 2, 2), seed=0)}, tmp_path / "in" / "clip.safetensors")  # clip_0, clip_1
    save_file({"latents": _z((1, 4, 1, 2, 2), seed=1)}, tmp_path / "in" / "clip_1.safetensors")
    argv = [str(tmp_path / "in"), "--output-dir", str(tmp_path / "o"), *TINY]
    assert_bad_input(main, tmp_path, capsys, argv, r"video 1\)' and '.*clip_1.safetensors' would both write")
    (tmp_path / "in" / "clip.safetensors").unlink()
    # Raw safetensors outputs into the inputs' own folder would replace them, --overwrite or not.
    argv = [str(tmp_path / "in"), "--output-dir", str(tmp_path / "in"), "--format", "safetensors", *TINY]
    assert_bad_input(main, tmp_path, capsys, [*argv, "--overwrite"], "one of the inputs")
    # --format names what --output-dir writes; --output's extension says it for one video.
    argv = [str(tmp_path / "in" / "clip_1.safetensors"), "-o", str(tmp_path / "x.mp4"), "--format", "npy", *TINY]
    assert_bad_input(main, tmp_path, capsys, argv, "--format goes with --output-dir")


def test_dry_run_plans_each_shape_and_reports_bad_inputs(tmp_path, capsys):
    _inputs(tmp_path / "in")
    out = tmp_path / "out"
    code = main([str(tmp_path / "in"), "--output-dir", str(out), "--batch-size", "4", "--dry-run", *TINY, "--json"])
    captured = capsys.readouterr()
    assert code == 4, captured.err  # as the run would end: bad.safetensors cannot be decoded
    summary = json.loads(captured.out)
    assert [f["input"] for f in summary["failed"]] == [str(tmp_path / "in" / "bad.safetensors")]
    # A shape with fewer videos than --batch-size runs at its own count: 2 pair videos, 3 others.
    assert sorted(summary["memory_plans"]) == ["[2, 4, 2, 4, 4]", "[3, 4, 3, 4, 6]"]
    # mp4 by default: each shape's videos would stream, within the budget.
    assert all(p["name"] == "streamed" for p in summary["memory_plans"].values())
    assert summary["stream_why_not"] == {}
    assert not out.exists()
    assert main([str(tmp_path / "in"), "--output-dir", str(out), "--format", "npy", "--dry-run", *TINY, "--json"]) == 4
    summary = json.loads(capsys.readouterr().out)
    assert all(p["name"] == "whole" for p in summary["memory_plans"].values())
    assert all("one array" in why for why in summary["stream_why_not"].values()) and len(summary["stream_why_not"]) == 2


def test_many_latents_stream_each_video_and_write_what_the_whole_decode_writes(tmp_path, capsys):
    from cogvideox_torchax.io import video

    _inputs(tmp_path / "in")
    (tmp_path / "in" / "bad.safetensors").unlink()
    runs = {}
    for mode in ("stream", "whole"):
        # Lossless, so the frames compare exactly whatever libx264 decides.
        flags = ["--crf", "0", "--batch-size", "2"] + (["--no-stream"] if mode == "whole" else [])
        assert main([str(tmp_path / "in"), "--output-dir", str(tmp_path / mode), *TINY, "--json", *flags]) == 0
        runs[mode] = json.loads(capsys.readouterr().out)
    s, w = runs["stream"], runs["whole"]
    assert s["shapes"] == w["shapes"] == [[2, 4, 2, 4, 4], [2, 4, 3, 4, 6]]  # v2 rides with padding
    assert [p["name"] for p in s["memory_plans"].values()] == ["streamed", "streamed"] and s["stream_why_not"] == {}
    assert set(w["stream_why_not"].values()) == {"--no-stream"}
    names = ["pair_0.mp4", "pair_1.mp4", "v0.mp4", "v1.mp4", "v2.mp4"]
    assert sorted(p.name for p in (tmp_path / "stream").iterdir()) == names
    for name in names:
        got, want = (video.read_mp4(tmp_path / mode / name)[0] for mode in ("stream", "whole"))
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_in_a_streamed_batch_one_failing_video_spares_the_others(tmp_path, capsys, monkeypatch):
    from cogvideox_torchax.io import video

    (tmp_path / "in").mkdir()
    for i in range(3):
        z = _z((1, 4, 9, 4, 6), seed=i)
        if i == 0:
            z[0, :, 8] = 6e4  # only v0's last latent frame batch overflows float16
        save_file({"latents": z}, tmp_path / "in" / f"v{i}.safetensors")
    real = video.FrameWriter.write

    def write(self, frames, tick=None):  # v1's writer fails in a way of its own, mid-video
        if self.dest.name.startswith(".v1.") and self.count > 0:  # staged .v1.mp4.XXXXXXXX.mp4
            raise RuntimeError("disk said no")
        real(self, frames, tick)

    monkeypatch.setattr(video.FrameWriter, "write", write)
    out = tmp_path / "out"
    argv = [str(tmp_path / "in"), "--output-dir", str(out), *TINY, "--dtype", "float16", "--no-unscale",
            "--batch-size", "3", "--json"]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 4, captured.err
    summary = json.loads(captured.out)
    assert summary["memory_plans"]["[3, 4, 9, 4, 6]"]["name"] == "streamed"
    failed = {f["input"].rsplit("/", 1)[-1]: f["error"] for f in summary["failed"]}
    assert set(failed) == {"v0.safetensors", "v1.safetensors"}
    assert "NaN or Inf" in failed["v0.safetensors"] and failed["v1.safetensors"] == "RuntimeError: disk said no"
    # v2 whole and playable; nothing of v0 or v1, no temporary left behind.
    assert sorted(p.name for p in out.iterdir()) == ["v2.mp4"]
    assert video.read_mp4(out / "v2.mp4")[0].shape == (33, 32, 48, 3)


def test_a_failed_batch_a_failed_write_and_a_changed_file_spare_the_rest(tmp_path, capsys, monkeypatch, library):
    from cogvideox_torchax.cli import decode
    from cogvideox_torchax.io import family_latents, video

    z = _inputs(tmp_path / "in")
    (tmp_path / "in" / "bad.safetensors").unlink()
    reads: dict[str, int] = {}
    read_for, decode_whole, write = family_latents.read_for, decode._decode, video.write_video_to

    def changing(vae, source, *args, **kwargs):  # v1 changes between the scan and its batch's read
        reads[source] = reads.get(source, 0) + 1
        if source.endswith("v1.safetensors") and reads[source] > 1:
            raise ValueError("v1 is now garbage")
        return read_for(vae, source, *args, **kwargs)

    def failing_decode(vae, zb, raw):  # the pair's batch fails on device
        if zb.shape[2] == 2:
            raise RuntimeError("device lost")
        return decode_whole(vae, zb, raw)

    def failing_write(path, kind, one, **kw):  # v2's write fails in a way of its own
        if Path(path).name.startswith(".v2."):  # staged .v2.npy.XXXXXXXX.npy (the random part may hold 'v2')
            raise RuntimeError("disk said no")
        return write(path, kind, one, **kw)

    monkeypatch.setattr(family_latents, "read_for", changing)
    monkeypatch.setattr(decode, "_decode", failing_decode)
    monkeypatch.setattr(video, "write_video_to", failing_write)
    out = tmp_path / "out"
    code = main([str(tmp_path / "in"), "--output-dir", str(out), "--format", "npy", "--batch-size", "3", *TINY, "--json"])
    captured = capsys.readouterr()
    assert code == 4, captured.err
    failed = {(f["input"].rsplit("/", 1)[-1], f.get("video")): f["error"] for f in json.loads(captured.out)["failed"]}
    assert failed == {
        ("v1.safetensors", 0): "v1 is now garbage",
        ("v2.safetensors", 0): "RuntimeError: disk said no",
        ("pair.safetensors", 0): "RuntimeError: device lost",
        ("pair.safetensors", 1): "RuntimeError: device lost",
    }
    assert "failed: " + repr(str(tmp_path / "in" / "pair.safetensors")) + " -> " in captured.err
    # Only v0 was written, whole and right; no temporary left behind.
    assert sorted(p.name for p in out.iterdir()) == ["v0.npy"]
    assert_close(np.load(out / "v0.npy"), library(z["v0"])[0], atol=1e-5, label="v0")


def test_padded_size_is_the_shape_count_or_the_batch_size_in_dp_multiples():
    assert jobs.padded_size(3, 8, 1) == 3
    assert jobs.padded_size(3, 8, 2) == 4
    assert jobs.padded_size(10, 8, 2) == 8
    assert jobs.padded_size(10, 3, 2) == 4  # --batch-size 3 on dp=2: runs of 3, padded to 4
    with pytest.raises(ValueError):
        jobs.padded_size(0, 8, 1)


def test_expand_inputs_folders_patterns_and_duplicates(tmp_path):
    for name in ("b.safetensors", "a.safetensors", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    found = jobs.expand_inputs([str(tmp_path), str(tmp_path / "a.safetensors"), str(tmp_path / "?.safetensors")])
    assert [p.name for p in found] == ["a.safetensors", "b.safetensors"]  # sorted, each once, no .txt


def test_batches_group_equal_shapes_in_order():
    items = [jobs.Job(f"{i}", 0, (f"o{i}",), (1, 4, 2 + i % 2, 2, 2)) for i in range(5)]
    runs = jobs.batches(items, 2)
    assert [[it.source for it in run] for run in runs] == [["0", "2"], ["4"], ["1", "3"]]
    assert jobs.output_name(Path("x/clip.safetensors"), 1, 3, "png") == "clip_1"


def test_a_failing_input_with_a_newline_in_its_name_is_one_quoted_line(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "bad\nname.safetensors").write_bytes(b"not a safetensors file")
    save_file({"latents": _z((1, 4, 1, 2, 2), seed=0)}, folder / "good.safetensors")
    assert main([str(folder), "--output-dir", str(tmp_path / "out"), "--format", "npy", *TINY]) == 4
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if "failed" in line]
    assert failed and all("bad\\nname.safetensors" in line for line in failed), err
    assert not any(line.strip() == "name.safetensors'" or line.startswith("name.safetensors") for line in err.splitlines())


def test_skip_existing_keeps_only_a_finished_output_of_its_kind(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    save_file({"latents": _z((1, 4, 1, 2, 2), seed=0)}, folder / "a.safetensors")
    out = tmp_path / "out"
    (out / "a.mp4").mkdir(parents=True)  # a folder where the video goes
    argv = [str(folder), "--output-dir", str(out), "--skip-existing", "--model", "random:tiny", "--mesh", "dp=1,tp=1"]
    assert_bad_input(main, tmp_path, capsys, argv, "is in the place of an output but is not one")
    assert sorted(p.name for p in out.iterdir()) == ["a.mp4"] and (out / "a.mp4").is_dir()


def test_links_to_nowhere_and_fifos_in_an_input_folder_are_named_as_unreadable(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    save_file({"latents": _z((1, 4, 1, 2, 2), seed=0)}, folder / "good.safetensors")
    (folder / "loop.safetensors").symlink_to(folder / "loop.safetensors")
    (folder / "dangling.safetensors").symlink_to(tmp_path / "gone.safetensors")
    os.mkfifo(folder / "fifo.safetensors")  # never opened: reading it would wait forever
    out = tmp_path / "out"
    assert main([str(folder), "--output-dir", str(out), "--format", "npy", *TINY, "--json"]) == 4
    captured = capsys.readouterr()
    reasons = {Path(f["input"]).name: f["error"] for f in json.loads(captured.out)["failed"]}
    assert set(reasons) == {"loop.safetensors", "dangling.safetensors", "fifo.safetensors"}, captured.err
    assert "leads nowhere" in reasons["loop.safetensors"] and "leads nowhere" in reasons["dangling.safetensors"]
    assert "not a regular file" in reasons["fifo.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == ["good.npy"]


def test_frames_too_large_for_h264_are_refused_before_decoding(tmp_path, capsys):
    save_file({"latents": _z((1, 4, 1, 2050, 2), seed=0)}, tmp_path / "wide.safetensors")  # 16400x16 frames
    argv = [str(tmp_path / "wide.safetensors"), "-o", str(tmp_path / "wide.mp4"), "--model", "random:tiny",
            "--mesh", "dp=1,tp=1"]
    assert_bad_input(main, tmp_path, capsys, argv, r"16400x16 are too large for H.264 .*at most 16384.*PNG")
    folder = tmp_path / "in"
    folder.mkdir()
    (tmp_path / "wide.safetensors").rename(folder / "wide.safetensors")
    save_file({"latents": _z((1, 4, 1, 2, 2), seed=0)}, folder / "small.safetensors")
    assert main([str(folder), "--output-dir", str(tmp_path / "out"), *TINY]) == 4  # reported, the other written
    assert "too large for H.264" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["small.mp4"]
