"""Tilings for the memory planner, for families whose tiles are sized and strided in video pixels.

Wan's, LTX-2's and HunyuanVideo's ``enable_tiling`` take a tile size and a
stride in video pixels (``tile_sample_min_*``, ``tile_sample_stride_*``);
upstream steps its tiles by a fixed fraction of their size (3/4 for Wan's
and HunyuanVideo's 256-pixel tiles at stride 192, 7/8 for LTX-2's 512 at
448). Each family's record says its fraction, its smallest tile and the
grids its upstream cannot decode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# How many tiles across the larger side the planner tries, fewest first.
COUNTS = (2, 3, 4, 6, 8)


def strided_candidates(
    latent_hw: tuple[int, int],
    ratio: Any,
    *,
    fraction: float,
    smallest: int,
    counts: Sequence[int] = COUNTS,
    refused: Callable[[tuple[int, int], tuple[int, int]], bool] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Tilings of a latent frame in order of growing tile counts: ``(name, enable_tiling keywords)``.

    Tiles of ``t = ceil(n / k)`` latents (at least ``smallest``) for each
    count ``k``, stepping by ``round(t * fraction)`` and blended over the
    rest, as upstream's default tiling proportions them; a grid that would
    cover the frame in one tile is left out, and so is one ``refused(tile,
    stride)`` says upstream fails on. ``ratio`` is upstream's
    ``spatial_compression_ratio`` (not an integer: upstream's tiling would
    fail, no candidates).
    """
    if not isinstance(ratio, int) or isinstance(ratio, bool):
        return []
    found, seen = [], set()
    for k in counts:
        tile = tuple(max(smallest, -(-n // k)) for n in latent_hw)
        if tile in seen or (tile[0] >= latent_hw[0] and tile[1] >= latent_hw[1]):
            continue
        seen.add(tile)
        stride = tuple(max(1, round(t * fraction)) for t in tile)
        if refused is not None and refused(tile, stride):
            continue
        found.append((f"tiles of {tile[0]}x{tile[1]} latents", {
            "tile_sample_min_height": tile[0] * ratio, "tile_sample_min_width": tile[1] * ratio,
            "tile_sample_stride_height": stride[0] * ratio, "tile_sample_stride_width": stride[1] * ratio,
        }))
    return found
