"""The decode command's streamed writing on Wan: host memory flat in length, and a signal mid-stream loses nothing.

Real processes on the wan-tiny config, as tests/contracts/test_streamed.py
and test_signals.py do for CogVideoX.
"""

import signal
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import save_file

from cogvideox_torchax.io import video
from tests.contracts.test_streamed import _PEAK

WAN = ["--model", "random:wan-tiny", "--mesh", "dp=1,tp=1", "--no-compile-cache"]


def _latents(tmp_path, t: int) -> str:
    z = np.random.default_rng(t).standard_normal((1, 16, t, 16, 16)).astype(np.float32)
    save_file({"z": z}, str(tmp_path / f"z{t}.safetensors"))
    return str(tmp_path / f"z{t}.safetensors")


def _peak_rss(tmp_path, t: int) -> int:
    argv = [sys.executable, "-m", "cogvideox_torchax.decode", _latents(tmp_path, t), *WAN,
            "-o", str(tmp_path / f"v{t}.mp4"), "--preset", "ultrafast"]
    done = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_thousand_wan_latent_frames_decode_in_the_host_memory_of_ten(tmp_path):
    short, long = _peak_rss(tmp_path, 10), _peak_rss(tmp_path, 1000)
    frames, fps = video.read_mp4(tmp_path / "v1000.mp4")
    assert frames.shape == (3997, 128, 128, 3) and fps == 16  # 1 + 4 x 999 frames, at Wan's 16 fps
    # The whole video is 3997 x 128 x 128 x 3 = 188 MiB as uint8 (750 MiB as fp32); streamed,
    # neither is held. The margin is CogVideoX's test's: half the uint8 video.
    assert long <= short + 96 * 2**20, (short / 2**20, long / 2**20)


def test_an_interrupt_mid_stream_leaves_nothing(tmp_path):
    argv = [sys.executable, "-m", "cogvideox_torchax.decode", _latents(tmp_path, 300), *WAN, "-o",
            str(tmp_path / "frames")]  # PNG frames, written as the stream goes
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    # Once the writer has begun (its staged folder exists), interrupt.
    while proc.poll() is None and time.monotonic() < deadline:
        staged = [p for p in tmp_path.iterdir() if p.name.startswith(".frames")]
        if staged and any(staged[0].iterdir()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the decode ended before the stream was interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.rstrip("\n").split("\n")[-1].startswith("error: interrupted; nothing was written"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z300.safetensors"]  # no output, no temporary
