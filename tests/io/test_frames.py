"""`io.frames`, what the encoder reads: every Pillow mode and 10-bit video read as 8-bit RGB, or refused by name.

8-bit modes as diffusers' video processor reads them (``convert("RGB")``);
16-bit greyscale scaled (``v / 257``), where ``convert`` would clip mid-grey to
white. Tolerances: exact for the PNG cases (lossless), 3 levels for H.264 at
crf 0 (its YUV rounding).
"""

from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from cogvideox_torchax.io import frames


def _folder(tmp_path, image, name="f.png"):
    folder = tmp_path / "frames"
    folder.mkdir()
    image.save(folder / name)
    return folder


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Image.fromarray(np.full((8, 8), 32768, np.uint16)), (128, 128, 128)),  # I;16 mid-grey
        (lambda: Image.fromarray(np.full((8, 8), 65535, np.uint16)), (255, 255, 255)),
        (lambda: Image.fromarray(np.full((8, 8), 257 * 10, np.uint16)), (10, 10, 10)),
        (lambda: Image.fromarray(np.full((8, 8, 2), (100, 50), np.uint8), "LA"), (100, 100, 100)),  # alpha dropped
        (lambda: Image.fromarray(np.full((8, 8, 4), (1, 2, 3, 0), np.uint8), "RGBA"), (1, 2, 3)),
        (lambda: Image.fromarray(np.full((8, 8), 255, np.uint8)).convert("1"), (255, 255, 255)),
        (lambda: Image.fromarray(np.full((8, 8, 3), (0, 204, 51), np.uint8)).convert("P"), (0, 204, 51)),
    ],
    ids=["16-bit-mid", "16-bit-white", "16-bit-dark", "LA", "RGBA", "1-bit", "palette"],
)
def test_image_modes_read_as_8_bit_rgb(tmp_path, make, expected):
    image = make()
    x, fps = frames.read_frames(_folder(tmp_path, image))
    assert fps is None and x.dtype == np.uint8 and x.shape == (1, 8, 8, 3)
    assert tuple(int(v) for v in x[0, 3, 3]) == expected, image.mode


def test_cmyk_reads_as_pillow_converts_it(tmp_path):
    image = Image.fromarray(np.full((8, 8, 3), (255, 0, 0), np.uint8)).convert("CMYK")
    x, _ = frames.read_frames(_folder(tmp_path, image, "f.jpg"))
    with Image.open(tmp_path / "frames" / "f.jpg") as im:
        assert im.mode == "CMYK"
        np.testing.assert_array_equal(x[0], np.asarray(im.convert("RGB")))


def test_32_bit_images_read_within_16_bits_and_are_refused_beyond(tmp_path):
    # No suffix the encoder reads stores mode I or F; older Pillows open 16-bit PNGs as I.
    within = Image.fromarray(np.full((8, 8), 32768, np.int32), "I")
    assert tuple(frames._to_rgb8(within, tmp_path / "f.png")[0, 0]) == (128, 128, 128)
    with pytest.raises(frames.FramesError, match=r"32-bit integer image \(I\)"):
        frames._to_rgb8(Image.fromarray(np.full((8, 8), 1 << 20, np.int32), "I"), tmp_path / "f.png")
    with pytest.raises(frames.FramesError, match=r"float image \(mode F\)"):
        frames._to_rgb8(Image.fromarray(np.full((8, 8), 0.5, np.float32), "F"), tmp_path / "f.png")


@pytest.mark.parametrize("pix_fmt", ["yuv420p10le", "yuv444p10le"])
def test_ten_bit_video_reads_as_8_bit_rgb(tmp_path, pix_fmt):
    path = tmp_path / "ten.mp4"
    colour = np.full((16, 16, 3), (128, 64, 200), np.uint8)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(8))
        stream.width = stream.height = 16
        stream.pix_fmt, stream.options = pix_fmt, {"crf": "0"}
        for _ in range(2):
            frame = av.VideoFrame.from_ndarray(colour, format="rgb24").reformat(format=pix_fmt)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    x, fps = frames.read_frames(path)
    assert x.shape == (2, 16, 16, 3) and fps == 8
    assert np.abs(x.astype(int) - colour.astype(int)).max() <= 3
