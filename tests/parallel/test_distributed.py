"""Two local processes x 4 simulated CPU devices as one `jax.distributed` cluster (gloo collectives).

Each check starts its processes with a coordinator on 127.0.0.1 and a free
port, waits at most a minute for them, and kills what is left. Results are
compared with this process's one-device decode (1e-5) and with upstream
eager torch (1e-5, fp32).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import cogvideox_torchax as ct
from cogvideox_torchax.parallel import distributed
from tests.support.cpu_codegen import with_flags
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode
from tests.support.two_process import latents

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5  # fp32: the same program on other meshes, and upstream eager


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, XLA_FLAGS=with_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu")
    env.pop("COGVIDEOX_TORCHAX_MEMORY_REPORT", None)
    return env


def run_processes(argvs: list[list[str]], cwd: Path, timeout: float = 90) -> list[subprocess.CompletedProcess]:
    """Runs one process per argv at once; kills them all if any is still running after ``timeout`` s."""
    procs = [
        subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv in argvs
    ]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for argv, p in zip(argvs, procs, strict=True):
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _reference(upstream, z: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
    ours = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1").decode(z).sample
    return ours.numpy(), upstream_decode(upstream, torch.from_numpy(z))


def test_two_processes_decode_as_one_process(tmp_path, tiny_upstream):
    coordinator = f"127.0.0.1:{_free_port()}"
    argv = [sys.executable, "-m", "tests.support.two_process", coordinator, "2"]
    runs = run_processes([[*argv, str(i), str(tmp_path)] for i in range(2)], cwd=ROOT)
    for i, r in enumerate(runs):
        assert r.returncode == 0, f"process {i} exited {r.returncode}: {r.stderr[-3000:]}"
        assert f"process {i}: (4, 3, 9, 32, 48) (1, 3, 9, 32, 48) on 8 devices" in r.stdout
    for name, z in (("batch", latents(4, seed=1)), ("wide", latents(1, seed=2))):
        ours, upstream = _reference(tiny_upstream, z)
        got = np.load(tmp_path / f"{name}.npy")
        assert_close(got, ours, atol=TOLERANCE, label=f"{name}: 2 processes vs 1 device")
        assert_close(got, upstream, atol=TOLERANCE, label=f"{name}: 2 processes vs upstream", check_dtype=False)


def test_two_processes_decode_wan_as_one_process(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    argv = [sys.executable, "-m", "tests.support.two_process", coordinator, "2"]
    runs = run_processes([[*argv, str(i), str(tmp_path), "wan-tiny"] for i in range(2)], cwd=ROOT, timeout=180)
    for i, r in enumerate(runs):
        assert r.returncode == 0, f"process {i} exited {r.returncode}: {r.stderr[-3000:]}"
        assert f"process {i}: (4, 3, 9, 32, 48) (1, 3, 9, 32, 48) on 8 devices" in r.stdout
    upstream = ct.random_upstream("wan-tiny", seed=0)
    for name, z in (("batch", latents(4, seed=1, channels=16)), ("wide", latents(1, seed=2, channels=16))):
        ours, expected = _reference(upstream, z)
        got = np.load(tmp_path / f"{name}.npy")
        assert_close(got, ours, atol=TOLERANCE, label=f"wan {name}: 2 processes vs 1 device")
        assert_close(got, expected, atol=TOLERANCE, label=f"wan {name}: 2 processes vs upstream", check_dtype=False)


def test_two_processes_decode_ltx_video_with_noise_as_process_0_would(tmp_path):
    # LTX-Video 0.9.1's tiny config injects noise; each process's generator is seeded differently, and the
    # program's replicated draws are process 0's on both (upstream from process 0's generator state).
    from tests.support.two_process import NOISE_SEED, with_noise_shown

    coordinator = f"127.0.0.1:{_free_port()}"
    argv = [sys.executable, "-m", "tests.support.two_process", coordinator, "2"]
    runs = run_processes([[*argv, str(i), str(tmp_path), "ltx-tiny"] for i in range(2)], cwd=ROOT, timeout=180)
    for i, r in enumerate(runs):
        assert r.returncode == 0, f"process {i} exited {r.returncode}: {r.stderr[-3000:]}"
    upstream = with_noise_shown(ct.random_upstream("ltx-tiny", seed=0))
    for name, z in (("batch", latents(4, seed=1, channels=8)), ("wide", latents(1, seed=2, channels=8))):
        expected = {}
        for seed in (NOISE_SEED, NOISE_SEED + 1):
            torch.manual_seed(seed)
            with torch.no_grad():
                expected[seed] = upstream.decode(torch.from_numpy(z), torch.zeros(z.shape[0])).sample
        got = np.load(tmp_path / f"{name}.npy")
        assert_close(got, expected[NOISE_SEED], atol=TOLERANCE, label=f"ltx-video {name}: 2 processes vs upstream",
                     check_dtype=False)
        assert np.abs(got - expected[NOISE_SEED + 1].numpy()).max() > 1e-2  # process 1's draws would show


def test_a_missing_process_ends_with_one_line_not_a_hang(tmp_path):
    # Process 1 never starts: process 0 gives up after its timeout.
    start = time.monotonic()
    (run,) = run_processes(
        [[sys.executable, "-c", _JOIN_ALONE, f"127.0.0.1:{_free_port()}"]], cwd=ROOT, timeout=60
    )
    assert run.returncode == distributed.EXIT_TIMEOUT, run.stderr[-2000:]
    assert "did not start within 3 s" in run.stderr and "process 0 of 2" in run.stderr
    assert "Check failure" not in run.stderr  # our line, not JAX's abort
    assert time.monotonic() - start < 45


def _decode_cli(coordinator: str, *argv: str) -> list[list[str]]:
    base = [sys.executable, "-m", "cogvideox_torchax.decode", *argv, "--model", "random:tiny", "--no-compile-cache"]
    return [[*base, "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)] for i in range(2)]


def test_two_process_cli_many_latents(tmp_path, tiny_upstream):
    z = {f"v{i}": latents(1, seed=10 + i) for i in range(4)}
    for name, t in z.items():
        save_file({"latents": t}, str(tmp_path / f"{name}.safetensors"))
    (tmp_path / "bad.safetensors").write_bytes(b"not latents")
    runs = run_processes(
        _decode_cli(
            f"127.0.0.1:{_free_port()}", str(tmp_path), "--output-dir", str(tmp_path / "out"), "--format", "npy",
            "--batch-size", "2", "--no-unscale", "--json",
        ),
        cwd=tmp_path,
    )
    # The same exit code everywhere: 4, one input failed and the others were written.
    assert [r.returncode for r in runs] == [4, 4], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    summary = json.loads(runs[0].stdout)  # only JSON on stdout, gloo's notes went to stderr
    assert runs[1].stdout == ""  # process 1 prints no summary
    assert summary["mesh"] == {"dp": 2, "tp": 4} and summary["processes"] == 2
    assert [Path(f["input"]).name for f in summary["failed"]] == ["bad.safetensors"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"v{i}.npy" for i in range(4)]
    for name, t in z.items():
        ours, upstream = _reference(tiny_upstream, t)
        got = np.load(tmp_path / "out" / f"{name}.npy")
        assert_close(got, ours[0], atol=TOLERANCE, label=f"{name}: CLI on 2 processes vs 1 device")
        assert_close(got, upstream[0], atol=TOLERANCE, label=f"{name}: CLI on 2 processes vs upstream", check_dtype=False)


def test_two_process_cli_one_video_over_all_devices(tmp_path, tiny_upstream):
    t = latents(1, seed=20)
    save_file({"latents": t}, str(tmp_path / "z.safetensors"))
    argv = ("z.safetensors", "-o", "video.npy", "--mesh", "dp=1,tp=8", "--no-unscale", "--json")
    runs = run_processes(_decode_cli(f"127.0.0.1:{_free_port()}", *argv), cwd=tmp_path)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    assert json.loads(runs[0].stdout)["mesh"] == {"dp": 1, "tp": 8} and runs[1].stdout == ""
    ours, upstream = _reference(tiny_upstream, t)
    got = np.load(tmp_path / "video.npy")
    assert_close(got, ours[0], atol=TOLERANCE, label="width-sharded over 2 processes vs 1 device")
    assert_close(got, upstream[0], atol=TOLERANCE, label="width-sharded over 2 processes vs upstream", check_dtype=False)
    # Bad input seen on process 0 only (its output now exists) ends both with its code, 2.
    before = (tmp_path / "video.npy").read_bytes()
    runs = run_processes(_decode_cli(f"127.0.0.1:{_free_port()}", *argv), cwd=tmp_path)
    assert [r.returncode for r in runs] == [2, 2]
    assert "exists; pass --overwrite" in runs[0].stderr and (tmp_path / "video.npy").read_bytes() == before


def test_two_process_cli_decodes_wan(tmp_path):
    z = latents(2, seed=30, channels=16)
    save_file({"latents": z}, str(tmp_path / "z.safetensors"))
    base = [sys.executable, "-m", "cogvideox_torchax.decode", "z.safetensors", "-o", "video.npy", "--no-unscale",
            "--json", "--model", "random:wan-tiny", "--no-compile-cache"]
    coordinator = f"127.0.0.1:{_free_port()}"
    runs = run_processes([[*base, "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)]
                          for i in range(2)], cwd=tmp_path, timeout=240)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    summary = json.loads(runs[0].stdout)
    assert summary["model"] == "AutoencoderKLWan" and summary["mesh"] == {"dp": 2, "tp": 4}
    ours, upstream = _reference(ct.random_upstream("wan-tiny", seed=0), z)
    for i in range(2):
        got = np.load(tmp_path / f"video_{i}.npy")
        assert_close(got, ours[i], atol=TOLERANCE, label=f"Wan video {i}: CLI on 2 processes vs 1 device")
        assert_close(got, upstream[i], atol=TOLERANCE, label=f"Wan video {i}: vs upstream", check_dtype=False)


def test_two_process_cli_encode(tmp_path, tiny_upstream):
    from PIL import Image
    from safetensors.numpy import load_file

    from cogvideox_torchax.io import frames

    clip = (np.arange(9 * 16 * 24 * 3).reshape(9, 16, 24, 3) * 7 % 256).astype(np.uint8)
    (tmp_path / "frames").mkdir()
    for i, frame in enumerate(clip):
        Image.fromarray(frame).save(tmp_path / "frames" / f"frame_{i:04d}.png")
    base = [sys.executable, "-m", "cogvideox_torchax.encode", "frames", "-o", "z.safetensors", "--model", "random:tiny"]
    coordinator = f"127.0.0.1:{_free_port()}"
    runs = run_processes(
        [[*base, "--no-compile-cache", "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)]
         for i in range(2)],
        cwd=tmp_path,
    )
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    got = load_file(str(tmp_path / "z.safetensors"))["latents"]
    vae = ct.wrap(tiny_upstream, dtype="float32", mesh="dp=1,tp=1")
    x = torch.from_numpy(frames.to_video_tensor(clip))
    expected = vae.encode(x).latent_dist.mode().permute(0, 2, 1, 3, 4) * vae.config.scaling_factor
    assert_close(got, expected, atol=TOLERANCE, label="encode CLI on 2 processes (tp=4 each) vs 1 device")


_JOIN_ALONE = """
import sys
from cogvideox_torchax.parallel import distributed
distributed.initialize_distributed(sys.argv[1], 2, 0, timeout_s=3)
"""


@pytest.mark.parametrize(
    "args, message",
    [
        (("127.0.0.1:1234", 2, None), "all of the coordinator"),
        (("127.0.0.1", 2, 0), "HOST:PORT"),
        (("127.0.0.1:1234", 2, 2), "0..1"),
    ],
)
def test_incomplete_cluster_arguments_are_refused(args, message):
    with pytest.raises(distributed.DistributedError, match=message):
        distributed.initialize_distributed(*args)


def test_one_process_helpers_pass_through():
    assert distributed.share_json({"a": [1]}) == {"a": [1]}
    assert distributed.share_array(np.arange(3)).tolist() == [0, 1, 2]
    assert distributed.gather_ints(2) == [2]

