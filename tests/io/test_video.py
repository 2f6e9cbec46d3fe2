"""cogvideox_torchax.io.video, .outputs and .latents: writing videos, staged outputs, latents layouts."""

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.video_processor import VideoProcessor

from cogvideox_torchax.io import latents, outputs, video
from tests.support.files import tree


def _write(path, v, overwrite=False):
    """One video written as the commands write it: staged, then moved in."""
    path = Path(path)
    with outputs.StagedOutputs([path], overwrite=overwrite) as staged:
        video.write_video_to(staged.temps[0], outputs.output_kind(path), v)
        staged.commit()


def test_to_uint8_is_diffusers_video_processor():
    # Values beyond [-1, 1] included: upstream's decoder does not clamp.
    x = torch.randn((2, 3, 5, 8, 6), generator=torch.Generator().manual_seed(0)) * 1.3
    pil = VideoProcessor(vae_scale_factor=8).postprocess_video(x, output_type="pil")
    expected = np.stack([np.stack([np.asarray(img) for img in vid]) for vid in pil])
    got = video.to_uint8(x.numpy())
    assert got.dtype == np.uint8 and got.shape == expected.shape == (2, 5, 8, 6, 3)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "path,kind",
    [("a.mp4", "mp4"), ("a.MP4", "mp4"), ("dir/frames", "png"), ("a.npy", "npy"), ("a.safetensors", "safetensors")],
)
def test_output_kind(path, kind):
    assert outputs.output_kind(path) == kind


def test_output_paths_one_per_video(tmp_path):
    assert outputs.output_paths(tmp_path / "v.mp4", 1) == [tmp_path / "v.mp4"]
    assert outputs.output_paths(tmp_path / "v.mp4", 3) == [tmp_path / f"v_{i}.mp4" for i in range(3)]
    assert outputs.output_paths(tmp_path / "frames", 2) == [tmp_path / "frames_0", tmp_path / "frames_1"]



def test_png_folder_overwrite_replaces_only_a_folder_of_frames(tmp_path):
    out = tmp_path / "frames"
    _write(out, np.zeros((3, 3, 4, 4), np.float32))
    with pytest.raises(outputs.OutputError, match="exists; pass --overwrite"):
        _write(out, np.zeros((3, 2, 4, 4), np.float32))
    _write(out, np.zeros((3, 2, 4, 4), np.float32), overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["frame_0000.png", "frame_0001.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["frames"]  # no temp or old folders left
    # Anything but frame files in it: refused even with overwrite, nothing touched.
    (out / "notes.txt").write_text("precious")
    (out / "sub").mkdir()
    before = tree(tmp_path)
    with pytest.raises(outputs.OutputError, match=r"holds 'notes.txt' \(and 1 more\).*never replaced"):
        _write(out, np.zeros((3, 1, 4, 4), np.float32), overwrite=True)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", ["v.npy", "frames"])
def test_overwrite_never_replaces_a_link_or_a_folder_with_a_file(tmp_path, name):
    target = tmp_path / "target.npy"
    target.write_bytes(b"keep")
    (tmp_path / "link.npy").symlink_to(target)
    (tmp_path / "dir.npy").mkdir()
    before = tree(tmp_path)
    with pytest.raises(outputs.OutputError, match="symbolic link"):
        _write(tmp_path / "link.npy", np.zeros(3, np.float32), overwrite=True)
    with pytest.raises(outputs.OutputError, match="a file output never replaces a folder"):
        _write(tmp_path / "dir.npy", np.zeros(3, np.float32), overwrite=True)
    assert tree(tmp_path) == before


def test_raw_npy_with_an_upper_case_suffix_lands_at_its_name(tmp_path):
    _write(tmp_path / "A.NPY", np.arange(3, dtype=np.float32))
    assert [p.name for p in tmp_path.iterdir()] == ["A.NPY"]
    np.testing.assert_array_equal(np.load(tmp_path / "A.NPY"), np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "fallback"])
def test_rename_noreplace_never_replaces(tmp_path, monkeypatch, renameat2):
    if not renameat2:
        monkeypatch.setattr(outputs, "_renameat2", None)
    elif outputs._renameat2 is None:
        pytest.skip("no renameat2 in this libc")
    (tmp_path / "src").write_bytes(b"new")
    (tmp_path / "dst").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        outputs.rename_noreplace(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "dst").read_bytes() == b"old" and (tmp_path / "src").read_bytes() == b"new"
    (tmp_path / "srcdir").mkdir()
    (tmp_path / "srcdir" / "frame_0000.png").write_bytes(b"x")
    (tmp_path / "empty").mkdir()  # a plain rename would replace an empty folder
    with pytest.raises(FileExistsError):
        outputs.rename_noreplace(tmp_path / "srcdir", tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []
    outputs.rename_noreplace(tmp_path / "srcdir", tmp_path / "newdir")
    outputs.rename_noreplace(tmp_path / "src", tmp_path / "newfile")
    assert (tmp_path / "newfile").read_bytes() == b"new" and (tmp_path / "newdir" / "frame_0000.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "empty", "newdir", "newfile"]


def test_an_output_that_appears_meanwhile_is_not_replaced_and_the_batch_is_all_or_nothing(tmp_path):
    paths = [tmp_path / "v_0.npy", tmp_path / "v_1.npy"]
    with outputs.StagedOutputs(paths) as staged:
        for tmp in staged.temps:
            tmp.write_bytes(b"ours")
        paths[1].write_bytes(b"theirs")  # appears after the start-up check
        with pytest.raises(outputs.OutputError, match="appeared while this command ran"):
            staged.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v_1.npy"]  # v_0 taken back, no temp left
    assert paths[1].read_bytes() == b"theirs"


def test_a_failed_commit_under_overwrite_restores_what_was_replaced(tmp_path, monkeypatch):
    paths = [tmp_path / "v_0.npy", tmp_path / "v_1"]
    paths[0].write_bytes(b"old 0")
    paths[1].mkdir()
    (paths[1] / "frame_0000.png").write_bytes(b"old frame")
    before = tree(tmp_path)
    real = outputs.rename_noreplace
    calls = []

    def second_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(outputs, "rename_noreplace", second_fails)
    with outputs.StagedOutputs(paths, overwrite=True) as staged:
        staged.temps[0].write_bytes(b"new 0")
        (staged.temps[1] / "frame_0000.png").write_bytes(b"new frame")
        with pytest.raises(OSError, match="No space"):
            staged.commit()
    assert tree(tmp_path) == before


def test_check_outputs_probes_by_creating_a_file(tmp_path, monkeypatch):
    # A folder whose permission bits say writable but that takes no new entry.
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with pytest.raises(outputs.OutputError, match="is not writable"):
        outputs.check_outputs([tmp_path / "o.npy"], overwrite=False)
    assert list(tmp_path.iterdir()) == []


def test_outputs_that_are_never_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(outputs.OutputError, match="current folder"):
        outputs.check_outputs([tmp_path], overwrite=True)
    with pytest.raises(outputs.OutputError, match="current folder|does not name"):
        outputs.check_outputs([outputs.Path(".")], overwrite=True)
    with pytest.raises(outputs.OutputError, match="too long: its name is 256 bytes, over its folder's 255"):
        outputs.check_outputs([tmp_path / ("x" * 252 + ".npy")], overwrite=False)  # NAME_MAX is 255 bytes
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(outputs.OutputError, match="is not a folder"):
        outputs.check_outputs([tmp_path / "file" / "o.npy"], overwrite=False)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_prepare_pipeline_latents():
    z = np.random.default_rng(0).standard_normal((1, 5, 16, 2, 3)).astype(np.float32)  # (B, T, C, H, W)
    out, layout = latents.prepare(z, 16, 0.5)
    assert layout == "BTCHW" and out.shape == (1, 16, 5, 2, 3)
    np.testing.assert_allclose(out, np.transpose(z, (0, 2, 1, 3, 4)) * 2, rtol=1e-7)
    same, layout = latents.prepare(z.transpose(0, 2, 1, 3, 4), 16, 0.5, unscale=False)
    assert layout == "BCTHW"
    np.testing.assert_array_equal(same, z.transpose(0, 2, 1, 3, 4))


@pytest.mark.parametrize(
    "shape,layout,match",
    [
        ((1, 16, 16, 2, 2), "auto", "ambiguous"),
        ((1, 8, 3, 2, 2), "auto", "no dimension with the model's 16 channels"),
        ((1, 3, 16, 2, 2), "BCTHW", "BCTHW needs 16 channels in dim 1"),
        ((1, 16, 3, 2), "auto", "5-D"),
        ((1, 16, 0, 2, 2), "auto", "empty"),
        ((1, 16, 3, 2, 2), "NCHW", "layout must be"),
    ],
)
def test_detect_layout_errors(shape, layout, match):
    with pytest.raises(latents.LatentsError, match=match):
        latents.detect_layout(shape, 16, layout)
