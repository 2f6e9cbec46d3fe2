"""What the commands' tests feed them: latents as a pipeline holds them, a folder of frames."""

from pathlib import Path

import numpy as np


def pipeline_latents(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Standard-normal float32 latents ``(B, C, T, H, W)``: as a pipeline holds them (scaled or normalised)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def frames_folder(path: Path, count: int, size: tuple[int, int], seed: int = 1) -> np.ndarray:
    """``count`` random RGB frames of ``size`` written as PNGs into a new folder ``path``; returns them, uint8."""
    from PIL import Image

    path.mkdir()
    frames = (np.random.default_rng(seed).random((count, *size, 3)) * 255).astype(np.uint8)
    for i, f in enumerate(frames):
        Image.fromarray(f).save(path / f"{i:03d}.png")
    return frames
