"""The mp4 writer encodes frames as they come: libx264 holds back 3 frames, not a short video's every frame.

Behind a device that hands over frames batch by batch (CogVideoX: 9, then
8 per latent frame pair), what libx264 holds back after a batch is encoded
only after the next batch, or the last, arrives. These tests count it
(no clock), check the file is one valid H.264 stream within the crf's loss
of its source, and time a streamed write behind a stand-in device against
the writer's own time measured in the same test.
"""

import numpy as np
import pytest

from bench import stand_in
from bench.writer_settings import BEFORE, SETTINGS, SegmentedWriter
from cogvideox_torchax.io import video

BATCHES = list(stand_in.device_batches("cogvideox", 49))  # [9, 8, 8, 8, 8, 8]


@pytest.fixture(scope="module")
def frames():
    return stand_in.textured_video(49, 64, 96)


def _x264_options(path) -> dict[str, str]:
    """The options libx264 wrote into the stream (its SEI: 'x264 - core ... options: a=1 b=2 ...')."""
    data = path.read_bytes()
    start = data.index(b"x264 - core")
    text = data[start:data.index(b"\x00", start)].decode()
    return dict(kv.split("=", 1) for kv in text.split("options: ", 1)[1].split())


def test_the_writer_holds_back_three_frames_after_each_batch_and_libx264s_lookahead_held_the_video(tmp_path, frames):
    held = stand_in.held_back(video.FrameWriter(tmp_path / "v.mp4", "mp4"), frames, BATCHES)
    assert held == 3
    options = _x264_options(tmp_path / "v.mp4")
    assert options["rc_lookahead"] == "3" and options["mbtree"] == "1" and options["bframes"] == "3"
    # Before: libx264's own lookahead (40 at medium) held everything given until 41 frames had come.
    before = video.FrameWriter(tmp_path / "b.mp4", "mp4", options=BEFORE)
    assert stand_in.held_back(before, frames, BATCHES) == 41
    assert _x264_options(tmp_path / "b.mp4")["rc_lookahead"] == "40"


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_split_each_frame_never_add_frames_held_back(tmp_path, threads):
    tall = stand_in.textured_video(17, 256, 96)  # 16 macroblock rows: room for slices
    held = stand_in.held_back(video.FrameWriter(tmp_path / "v.mp4", "mp4", threads=threads), tall, [9, 8])
    options = _x264_options(tmp_path / "v.mp4")
    assert options["threads"] == str(threads) and options["sliced_threads"] == str(int(threads > 1))
    assert held == 3


def test_the_mp4_is_one_stream_of_every_frame_within_the_crfs_loss(tmp_path, frames):
    import av

    with video.FrameWriter(tmp_path / "v.mp4", "mp4", crf=18) as writer:
        for start, size in zip(np.cumsum([0, *BATCHES[:-1]]), BATCHES, strict=True):
            writer.write(frames[start:start + size])
    read, psnr = stand_in.read_back(tmp_path / "v.mp4", frames)
    with av.open(str(tmp_path / "v.mp4")) as container:
        assert len(container.streams) == 1 and container.streams.video[0].codec_context.name == "h264"
        assert float(container.streams.video[0].average_rate) == 8
    assert read == 49
    # crf 18 on 64x96 textured frames (yuv420p's halved colour included): 35.3 dB; crf 0 is lossless in
    # yuv444p, so what remains is RGB to YUV and back in 8 bits.
    assert 33 < psnr < 45, psnr
    with video.FrameWriter(tmp_path / "lossless.mp4", "mp4", crf=0) as writer:
        writer.write(frames)
    read, lossless = stand_in.read_back(tmp_path / "lossless.mp4", frames)
    assert read == 49 and lossless > 50


def test_a_segmented_encode_joins_into_one_stream_of_every_frame(tmp_path, frames):
    import av

    writer = SegmentedWriter(tmp_path / "s.mp4", segment=8, workers=2)
    assert stand_in.held_back(writer, frames, BATCHES) == 0  # each batch completes a segment: its encode can start
    read, psnr = stand_in.read_back(tmp_path / "s.mp4", frames)
    assert read == 49 and psnr > 33
    with av.open(str(tmp_path / "s.mp4")) as container:
        assert len(container.streams) == 1
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
    keys = sorted(int(p.pts * p.time_base * 8 + 0.5) for p in packets if p.is_keyframe)
    assert len(packets) == 49 and keys == [0, 9, 17, 25, 33, 41]  # each segment opens on its own IDR frame


def test_the_stand_in_yields_the_devices_batches_on_its_schedule(frames):
    import time

    fps = 400.0
    start = time.perf_counter()
    arrived = [(chunk.start, chunk.frames, time.perf_counter() - start) for chunk in stand_in.StandIn(frames, fps)]
    assert [(s, n) for s, n, _ in arrived] == [(0, 9), (9, 8), (17, 8), (25, 8), (33, 8), (41, 8)]
    for s, n, t in arrived:
        assert t >= (s + n) / fps - 1e-3  # never before a device of that speed would have the batch
    # Textured: neither flat nor noise (neighbouring pixels alike, frames unlike), the same every time.
    assert frames.std() > 30 and np.abs(np.diff(frames.astype(int), axis=2)).mean() < 12
    assert np.abs(frames[1].astype(int) - frames[0]).mean() > 1
    np.testing.assert_array_equal(frames[:3], stand_in.textured_video(3, 64, 96))


def test_every_setting_of_the_bench_writes_a_valid_mp4(tmp_path, frames):
    for name, (_, open_writer) in SETTINGS.items():
        stand_in.write_alone(open_writer(tmp_path / f"{name}.mp4", 18, 2), frames[:17])
        read, psnr = stand_in.read_back(tmp_path / f"{name}.mp4", frames[:17])
        assert read == 17 and psnr > 30, name


def test_streamed_behind_a_slower_device_the_write_ends_soon_after_the_decode(tmp_path):
    # The writer's own time is measured here first; the device then hands the same frames over at half the
    # writer's speed. What remains after the last batch is that batch (8 of 49 frames) and the 3 frames held
    # back: about 0.22 of the writer's own time; libx264's own lookahead left 0.85 of it (41 frames and the
    # last batch's own 8). The bound, 0.5, lies between; the best of two tries, for a busy machine.
    tall = stand_in.textured_video(49, 192, 288)
    alone = min(stand_in.write_alone(video.FrameWriter(tmp_path / "a.mp4", "mp4"), tall) for _ in range(2))
    after = []
    for _ in range(2):
        t = stand_in.write_streamed(video.FrameWriter(tmp_path / "s.mp4", "mp4"), tall, 0.5 * 49 / alone)
        after.append((t.end_to_end_s - t.decode_s) / alone)
        if after[-1] <= 0.5:
            break
    assert min(after) <= 0.5, (alone, after)
    assert stand_in.read_back(tmp_path / "s.mp4", tall)[0] == 49


def test_bench_stream_stand_in_reports_both_regimes_for_each_setting():
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "bench.stream", "--stand-in", "4x,0.5x", "--videos", "64x96x17", "--settings",
           "default,before", "--cores", "1", "--rd-crfs", "16,18,20", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["command"].startswith("python -m bench.stream --stand-in") and report["av"]
    alone = {r["setting"]: r for r in report["rows"] if r["kind"] == "alone"}
    assert alone["default"]["held_back"] == 3 and alone["before"]["held_back"] == 17  # all of a 17-frame video
    assert all(r["frames_read"] == 17 and r["psnr_db"] > 30 for r in alone.values())
    # The writer before (libx264's own lookahead, sliced threads) is not bit-exact from run to run on every
    # machine: four encodes of this video at crf 18 made 12,462 to 12,568 B on a 2-core AMD EPYC (2026-11-28),
    # the decode command's writer 10,994 B each time. 2 % still tells its own point from the next crf's (~20 %).
    assert alone["before"]["bytes_at_before_psnr"] == pytest.approx(alone["before"]["bytes"], rel=2e-2)
    streamed = [r for r in report["rows"] if r["kind"] == "streamed"]
    assert [(r["setting"], r["device"]) for r in streamed] == [
        ("default", "4x"), ("default", "0.5x"), ("before", "4x"), ("before", "0.5x")]
    for r in streamed:
        assert r["frames_read"] == 17 and r["end_to_end_s"] >= r["decode_s"] >= r["first_frame_s"] > 0
        assert r["regime"] == ("device faster" if r["device"] == "4x" else "device slower")
        # "met" is decided on the unrounded times: at a tie in milliseconds either answer is right.
        assert r["met"] == (r["end_to_end_s"] <= r["bound_s"]) or r["end_to_end_s"] == r["bound_s"]
        assert r["floor_s"] > 0


def test_the_stand_ins_batches_are_each_familys_stream_batches():
    # Read from the family records; upstream's loops: CogVideoX 2 latent frames a batch (the odd one first,
    # 3 -> 9 frames), Wan 1 (1 frame, then 4).
    assert stand_in.device_batches("cogvideox", 49) == (9, 8, 8, 8, 8, 8)
    assert stand_in.device_batches("cogvideox", 81) == (9, *[8] * 9)
    assert stand_in.device_batches("cogvideox", 1) == (1,)
    assert stand_in.device_batches("wan", 17) == (1, 4, 4, 4, 4)
    assert stand_in.device_batches("wan", 1) == (1,)
    with pytest.raises(ValueError, match="4k\\+1"):
        stand_in.device_batches("wan", 16)
    with pytest.raises(ValueError, match="unknown family"):
        stand_in.device_batches("ltx", 17)


def test_bench_stream_stand_in_takes_wans_batches():
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "bench.stream", "--stand-in", "0.5x", "--videos", "64x96x17", "--settings",
           "default", "--batches", "wan", "--cores", "1", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [(r["kind"], r["batches"]) for r in rows] == [("alone", "wan"), ("streamed", "wan")]
    streamed = rows[1]
    assert streamed["frames_read"] == 17
    # Behind the slower device the floor's tail is the last batch: Wan's 4 frames of 17 (CogVideoX's 8 would
    # add 4/17 of the writer's time); three roundings.
    first, decode, alone = streamed["first_frame_s"], streamed["decode_s"], streamed["alone_s"]
    assert streamed["floor_s"] == pytest.approx(max(first + alone, decode + alone * 4 / 17), abs=2e-3)


def test_the_streamed_write_hands_over_the_batches_it_is_given(frames):
    class Writer:  # records each hand-over
        sizes: list = []

        def write(self, batch, tick=None):
            self.sizes.append(len(batch))

        def close(self):
            pass

    stand_in.write_streamed(Writer(), frames[:17], 1e6, [1, 4, 4, 4, 4])
    assert Writer.sizes == [1, 4, 4, 4, 4]
