"""cogvideox_torchax.video and .latents: the pieces under the command line."""

import numpy as np
import pytest
import torch
from diffusers.video_processor import VideoProcessor

from cogvideox_torchax import latents, video


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
    assert video.output_kind(path) == kind


def test_output_paths_one_per_video(tmp_path):
    assert video.output_paths(tmp_path / "v.mp4", 1) == [tmp_path / "v.mp4"]
    assert video.output_paths(tmp_path / "v.mp4", 3) == [tmp_path / f"v_{i}.mp4" for i in range(3)]
    assert video.output_paths(tmp_path / "frames", 2) == [tmp_path / "frames_0", tmp_path / "frames_1"]


def test_png_folder_overwrite_replaces_the_whole_folder(tmp_path):
    out = tmp_path / "frames"
    frames = np.zeros((3, 3, 4, 4), np.float32)
    video.write_video(out, frames)
    (out / "stray.txt").write_text("old")
    video.write_video(out, np.zeros((3, 2, 4, 4), np.float32))
    assert sorted(p.name for p in out.iterdir()) == ["frame_0000.png", "frame_0001.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["frames"]  # no temp or old folders left


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
