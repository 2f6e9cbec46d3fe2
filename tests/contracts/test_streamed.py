"""The decode command's streamed mp4 and PNG outputs: the same video, written while the device decodes.

A streamed run writes each latent frame batch's frames (on a writer thread)
while the next batch decodes. Its output equals the decode-then-write run's
(``--no-stream``); a failure mid-stream (frames that overflow, a full disk)
ends with the same exit codes and leaves nothing; a long video decodes in
flat host memory.
"""

import errno
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from cogvideox_torchax.cli import decode
from cogvideox_torchax.io import video
from tests.support.files import tree

TINY = ["--model", "random:tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache", "--quiet", "--layout", "BCTHW"]


def _save(folder, t, seed=0, name="z"):
    z = torch.randn((2, 4, t, 4, 6), generator=torch.Generator().manual_seed(seed))
    save_file({"z": z}, folder / f"{name}.safetensors")
    return z


@pytest.mark.parametrize("suffix", [".mp4", ""])
def test_the_streamed_output_equals_decode_then_write(tmp_path, capsys, suffix):
    _save(tmp_path, 9)
    runs = {}
    for mode in ("stream", "whole"):
        # Lossless: the decoded frames compare exactly whatever libx264 decides (its choices may
        # differ between runs on a busy machine); PNG frames compare byte for byte.
        flags = ["--crf", "0"] + (["--no-stream"] if mode == "whole" else [])
        out = tmp_path / f"{mode}{suffix}"
        assert decode.main([str(tmp_path / "z.safetensors"), *TINY, "-o", str(out), "--json", *flags]) == 0
        runs[mode] = json.loads(capsys.readouterr().out)
    s, w = runs["stream"], runs["whole"]
    assert s["streamed"] is True and s["memory_plan"]["name"] == "streamed" and s["stream_why_not"] is None
    assert w["streamed"] is False and w["stream_why_not"] == "--no-stream"
    assert 0 < s["first_frame_s"] <= s["decode_s"] <= s["end_to_end_s"] and 0 <= s["write_hidden"] <= 1
    assert s["video_shape"] == w["video_shape"] == [2, 3, 33, 32, 48]
    for i in (0, 1):
        if suffix:
            got, want = (video.read_mp4(tmp_path / f"{m}_{i}.mp4")[0] for m in ("stream", "whole"))
            np.testing.assert_array_equal(got, want)
        else:
            a, b = (sorted((tmp_path / f"{m}_{i}").iterdir()) for m in ("stream", "whole"))
            assert [p.name for p in a] == [p.name for p in b] and len(a) == 33
            assert all(p.read_bytes() == q.read_bytes() for p, q in zip(a, b, strict=True))


def test_raw_outputs_say_why_they_are_not_streamed(tmp_path, capsys):
    _save(tmp_path, 3)
    assert decode.main([str(tmp_path / "z.safetensors"), *TINY, "-o", str(tmp_path / "v.npy"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["streamed"] is False and "one array" in s["stream_why_not"]


def test_frames_that_overflow_in_a_late_batch_leave_nothing_with_exit_2(tmp_path, capsys):
    z = torch.randn((1, 4, 9, 4, 6), generator=torch.Generator().manual_seed(1))
    z[0, :, 8] = 6e4  # only the last batch overflows float16
    save_file({"z": z}, tmp_path / "z.safetensors")
    before = tree(tmp_path)
    argv = [str(tmp_path / "z.safetensors"), *TINY, "--dtype", "float16", "--no-unscale", "-o", str(tmp_path / "v.mp4")]
    assert decode.main(argv) == 2
    err = capsys.readouterr().err
    assert err.rstrip("\n").split("\n")[-1].startswith("error: ") and "Traceback" not in err, err
    assert tree(tmp_path) == before  # the batches already written went with their staged entry


def test_a_full_disk_mid_stream_is_named_with_exit_1_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    _save(tmp_path, 9)
    real = video.FrameWriter.write
    calls = []

    def fills_up(self, frames, tick=None):
        calls.append(len(frames))
        if len(calls) > 2:  # the second batch of frames of the first video
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, frames, tick)

    monkeypatch.setattr(video.FrameWriter, "write", fills_up)
    before = tree(tmp_path)
    out = tmp_path / "v.mp4"
    assert decode.main([str(tmp_path / "z.safetensors"), *TINY, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: the disk is full writing {str(tmp_path / 'v_0.mp4')!r}"), err
    assert tree(tmp_path) == before


def test_an_encoder_that_cannot_start_here_is_refused_before_anything_runs(tmp_path, capsys):
    _save(tmp_path, 3)
    before = tree(tmp_path)
    argv = [str(tmp_path / "z.safetensors"), *TINY, "-o", str(tmp_path / "v.mp4"), "--encoder", "h264_nvenc"]
    try:
        video.check_encoder("h264_nvenc")
    except ValueError:
        assert decode.main(argv) == 2
        assert "h264_nvenc encoder cannot start here" in capsys.readouterr().err
        assert tree(tmp_path) == before
    else:  # a machine with an NVIDIA GPU: NVENC writes the video
        assert decode.main(argv) == 0
    for bad, said in ((["--encoder", "mpeg2"], "--encoder must be one of"), (["--preset", "fastest"], "--preset for")):
        assert decode.main([str(tmp_path / "z.safetensors"), *TINY, "-o", str(tmp_path / "w.mp4"), *bad]) == 2
        assert said in capsys.readouterr().err


_PEAK = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
assert done.returncode == 0, done.stderr
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def _peak_rss(tmp_path, t: int) -> int:
    z = torch.randn((1, 4, t, 16, 16), generator=torch.Generator().manual_seed(t))
    save_file({"z": z}, tmp_path / f"z{t}.safetensors")
    argv = [sys.executable, "-m", "cogvideox_torchax.decode", str(tmp_path / f"z{t}.safetensors"), *TINY,
            "-o", str(tmp_path / f"v{t}.mp4"), "--preset", "ultrafast"]
    done = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_thousand_latent_frames_decode_in_the_host_memory_of_ten(tmp_path):
    short, long = _peak_rss(tmp_path, 10), _peak_rss(tmp_path, 1000)
    frames, _ = video.read_mp4(tmp_path / "v1000.mp4")
    assert frames.shape == (4000, 128, 128, 3)
    # The whole video is 4000 x 128 x 128 x 3 = 188 MiB as uint8 and 750 MiB as the
    # decoder's fp32 on the device (the host, here); streamed, neither is held. The
    # margin is half the uint8 video: a long run's peak sits 25 to 52 MiB above a
    # 10-frame run's at this frame size (two batches' temporaries in flight from the
    # start, more threads' malloc arenas touched; seen on both stacks, busy or quiet),
    # and stays flat from its first seconds to its last.
    assert long <= short + 96 * 2**20, (short / 2**20, long / 2**20)


def test_a_video_whose_whole_decode_does_not_fit_streams_within_the_budget(tmp_path, capsys):
    import cogvideox_torchax as ct
    from cogvideox_torchax.memory import budget

    shape = (1, 4, 17, 4, 6)
    vae = ct.wrap(ct.random_upstream("tiny", seed=0), mesh="dp=1,tp=1")
    streamed = vae.stream_plan(shape).bytes
    # A budget between the streamed decode's bytes and the smallest whole or tiled plan's (that no
    # whole or tiled plan fits it is the --no-stream run's exit 3 below).
    max_memory = int(budget.budget_for(streamed * 1.05))
    z = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    save_file({"z": z}, tmp_path / "z.safetensors")
    argv = [str(tmp_path / "z.safetensors"), *TINY, "--no-unscale", "--max-memory", f"{max_memory}B", "--json"]
    assert decode.main([*argv, "-o", str(tmp_path / "v.mp4")]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["streamed"] is True and s["memory_plan"]["name"] == "streamed"
    assert s["memory_plan"]["bytes"] == streamed and s["video_shape"] == [1, 3, 65, 32, 48]
    # Whole, the same budget has no plan: exit 3, nothing written.
    before = tree(tmp_path)
    assert decode.main([*argv, "-o", str(tmp_path / "w.mp4"), "--no-stream"]) == 3
    assert "no plan for the decode of (1, 4, 17, 4, 6) fits" in capsys.readouterr().err
    assert tree(tmp_path) == before
