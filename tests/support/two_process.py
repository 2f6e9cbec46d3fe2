"""One process of the two-process library check in tests/parallel/test_distributed.py.

``python -m tests.support.two_process COORD N I OUT [PRESET]`` joins a
`jax.distributed` cluster, builds the tiny VAE (or PRESET's; seeded: every
process builds the same weights) and decodes, on the default mesh (one
``dp`` row per process) a batch of 4 videos, and on ``dp=1,tp=<all>`` one
video width-sharded over every device. Process 0 saves both to OUT/*.npy.
"""

import sys
from pathlib import Path

import numpy as np
import torch

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.parallel import distributed


NOISE_SEED = 100


def with_noise_shown(upstream: torch.nn.Module) -> torch.nn.Module:
    """``upstream`` with its noise scales (0 at init: no noise would show) at 0.3."""
    with torch.no_grad():
        for name, value in upstream.named_parameters():
            if "per_channel_scale" in name:
                value.fill_(0.3)
    return upstream


def latents(batch: int, seed: int, channels: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, channels, 3, 4, 6)).astype(np.float32)


def main(coordinator: str, num_processes: int, process_id: int, out: Path, preset: str = "tiny") -> None:
    distributed.initialize_distributed(coordinator, num_processes, process_id, timeout_s=60)
    import jax

    upstream = with_noise_shown(ct.random_upstream(preset, seed=0))
    devices = jax.device_count()
    channels = families.of_module(upstream).latent_channels(upstream.config)

    batched = ct.wrap(upstream, dtype="float32")  # default: dp across processes
    assert dict(batched.mesh.shape) == {"dp": num_processes, "tp": devices // num_processes}
    torch.manual_seed(NOISE_SEED + process_id)
    video = batched.decode(latents(4, seed=1, channels=channels)).sample.numpy()

    wide = ct.wrap(upstream, dtype="float32", mesh=f"dp=1,tp={devices}")
    torch.manual_seed(NOISE_SEED + process_id)
    one = wide.decode(latents(1, seed=2, channels=channels)).sample.numpy()

    if distributed.is_primary():
        np.save(out / "batch.npy", video)
        np.save(out / "wide.npy", one)
    print(f"process {process_id}: {video.shape} {one.shape} on {devices} devices", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), *sys.argv[5:6])
