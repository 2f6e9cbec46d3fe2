"""``python -m bench.throughput``: videos/s for a batch of latents on 1 device, N devices, and P processes.

Each layout runs in fresh processes (the device count is fixed when JAX
starts; several processes form one `jax.distributed` cluster on
127.0.0.1 with gloo collectives), builds the VAE with seeded weights,
decodes the same batch once to compile, then times ``--repeats`` decodes
(each ended by `jax.block_until_ready`, the median kept)::

    python -m bench.throughput --model random:tiny --shape 3,8,8 --batch 8 --layouts 1x1,1x8,2x4

A layout ``PxD`` is P processes of D simulated CPU devices each, on a mesh
``dp=P*D,tp=1`` (the batch split over every device), so 1x8 and 2x4 do the
same work and differ only in crossing processes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:tiny", help="random:PRESET")
    p.add_argument("--shape", default="3,8,8", help="latent T,H,W of each video")
    p.add_argument("--batch", type=int, default=8, help="videos decoded together")
    p.add_argument("--layouts", default="1x1,1x8,2x4", help="PROCESSESxDEVICES, comma separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per layout before its processes are ended")
    p.add_argument("--worker", nargs=3, metavar=("COORDINATOR", "PROCESSES", "INDEX"), help=argparse.SUPPRESS)
    return p


def _worker(args: argparse.Namespace) -> dict:
    """One process of a layout: compile, then time; process 0 returns the figures."""
    coordinator, processes, index = args.worker[0], int(args.worker[1]), int(args.worker[2])
    from cogvideox_torchax.parallel import distributed

    if processes > 1:
        distributed.initialize_distributed(coordinator, processes, index, timeout_s=120)
    import jax
    import numpy as np

    import cogvideox_torchax as ct
    from bench.inputs import latent_channels, load_upstream

    upstream = load_upstream(args.model, seed=0)
    devices = jax.device_count()
    vae = ct.wrap(upstream, dtype=args.dtype, mesh=f"dp={devices},tp=1")
    t, h, w = (int(v) for v in args.shape.split(","))
    z = np.random.default_rng(0).standard_normal((args.batch, latent_channels(upstream), t, h, w))
    z = z.astype(np.float32)
    t0 = time.perf_counter()
    jax.block_until_ready(vae.decode_frames_jax(z))
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(vae.decode_frames_jax(z))
        times.append(time.perf_counter() - t0)
    steady = statistics.median(times)
    return {
        "processes": processes,
        "devices": devices,
        "mesh": dict(vae.mesh.shape),
        "first_call_s": round(first, 3),
        "decode_s": round(steady, 3),
        "videos_per_s": round(args.batch / steady, 3),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_layout(args: argparse.Namespace, processes: int, devices: int) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    coordinator = f"127.0.0.1:{_free_port()}"
    base = [sys.executable, "-m", "bench.throughput", "--model", args.model, "--shape", args.shape,
            "--batch", str(args.batch), "--repeats", str(args.repeats), "--dtype", args.dtype]
    procs = [
        subprocess.Popen([*base, "--worker", coordinator, str(processes), str(i)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(processes)
    ]
    deadline = time.monotonic() + args.timeout
    try:
        outs = [p.communicate(timeout=max(deadline - time.monotonic(), 1.0)) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit(f"layout {processes}x{devices} did not finish within --timeout {args.timeout:g} s") from None
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"layout {processes}x{devices} failed (exit {p.returncode}):\n{err[-3000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        result = _worker(args)
        if int(args.worker[2]) == 0:
            print(json.dumps(result), flush=True)
        return 0
    rows = []
    for layout in args.layouts.split(","):
        processes, devices = (int(v) for v in layout.lower().split("x"))
        rows.append({"layout": layout, **_run_layout(args, processes, devices)})
    report = {
        "command": "python -m bench.throughput " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "video_latents": [int(v) for v in args.shape.split(",")],
        "batch": args.batch,
        "dtype": args.dtype,
        "cpu_cores": os.cpu_count(),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['command']}\n{args.batch} videos of latents {args.shape} ({args.model}, {args.dtype}), "
          f"{os.cpu_count()} CPU cores")
    print("| layout (processes x devices) | mesh | first call s | decode s | videos/s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
        print(f"| {r['layout']} | {mesh} | {r['first_call_s']} | {r['decode_s']} | {r['videos_per_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
