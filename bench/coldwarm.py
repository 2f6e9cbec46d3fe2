"""``--cold-warm``: each system in two fresh processes sharing a new persistent compile cache.

The first process compiles (a cold start), the second finds the programs in
the cache (a warm start); each reports its time to first frame. A process is
``python -m bench.decode ... --child SYSTEM``, which runs `child`. JAX's
cache is ours and the port's; the torch.compile rows' is inductor's own
(``TORCHINDUCTOR_CACHE_DIR``, in the same new folder), whose hits JAX's
counts do not see.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.inputs import latent_channels, latents, load_upstream, shapes
from bench.runners import BENCHES
from bench.systems import system


def child(args: argparse.Namespace, t_process: float) -> int:
    """One fresh process: load, compile (through the persistent cache) and decode once.

    ``t_process``: ``time.perf_counter()`` at the process start, near enough.
    """
    from cogvideox_torchax.vae import compile_cache

    if system(args.child).framework == "jax":
        compile_cache.enable_compile_cache(os.environ["COGVIDEOX_TORCHAX_CACHE_DIR"])
    upstream = load_upstream(args.model, args.seed)
    shape = shapes(args, latent_channels(upstream))[0]
    args.repeats, args.profile, args.compile_only = 0, False, False
    with compile_cache.count_cache_events() as events:
        row = BENCHES[args.child](upstream, latents(shape, args.seed), args)
    print(
        json.dumps(
            {
                "process_to_first_frame_s": time.perf_counter() - t_process,
                "time_to_first_frame_s": row["time_to_first_frame_s"],
                "compile_s": row["compile_s"],
                "cache_hits": events.hits,
                "cache_misses": events.misses,
            }
        )
    )
    return 0


def cold_warm(system: str, argv: list[str]) -> dict[str, Any]:
    """Runs ``system`` in two fresh processes sharing a new compile cache; both reports."""
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:
        inductor = os.path.join(cache, "inductor")
        env = dict(os.environ, COGVIDEOX_TORCHAX_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=inductor)
        runs = []
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-m", "bench.decode", *argv, "--child", system],
                capture_output=True,
                text=True,
                env=env,
            )
            if done.returncode != 0:
                raise RuntimeError(f"--cold-warm {system} child failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    return {
        "cold_first_frame_s": cold["time_to_first_frame_s"],
        "warm_first_frame_s": warm["time_to_first_frame_s"],
        "cold_process_s": cold["process_to_first_frame_s"],
        "warm_process_s": warm["process_to_first_frame_s"],
        "cold_compile_s": cold["compile_s"],
        "warm_compile_s": warm["compile_s"],
        "cold_cache_misses": cold["cache_misses"],
        "warm_cache_hits": warm["cache_hits"],
        "warm_cache_misses": warm["cache_misses"],
    }


def child_argv(argv: list[str]) -> list[str]:
    """The parent's arguments without the modes a child must not repeat."""
    return without_options(
        argv,
        flags={"--cold-warm", "--profile", "--json", "--compile-only", "--no-reference"},
        valued={"--plot", "--sweep", "--sweep-values", "--systems", "--repeats", "--isolate"},
    )


def without_options(argv: list[str], flags: set[str], valued: set[str]) -> list[str]:
    """``argv`` without the options named: ``flags`` stand alone, ``valued`` take a value (``--x V`` or ``--x=V``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in flags:
            continue
        if key in valued:
            skip = "=" not in a
            continue
        out.append(a)
    return out
