"""Tile sizes for upstream CogVideoX's tiled decode that keep its grid consistent with the whole video."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any


def tiles(latent_hw: tuple[int, int], spatial_scale: int, overlaps: tuple[float, float],
          counts: Sequence[int]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, enable_tiling keywords)`` for growing tile counts over a latent frame of ``latent_hw``.

    Each tile is about ``1/k`` of the frame for k in ``counts``, rounded up
    to a multiple of the overlap's denominator (6 and 5 for upstream's
    overlap factors 1/6 and 1/5): upstream's tiled decode crops each tile to
    ``tile - int(tile * overlap)`` pixels while stepping by
    ``int(tile * (1 - overlap))`` latents, and only such tiles make the two
    agree, so the tiled video has the whole video's size. Counts that give
    no new, smaller tile are skipped.
    """
    multiples = [Fraction(o).limit_denominator(64).denominator for o in overlaps]
    seen = set()
    for k in counts:
        tile = tuple(max(m, math.ceil(math.ceil(n / k) / m) * m) for n, m in zip(latent_hw, multiples, strict=True))
        if tile in seen or (tile[0] >= latent_hw[0] and tile[1] >= latent_hw[1]):
            continue
        seen.add(tile)
        yield (
            f"tiles of {tile[0]}x{tile[1]} latents",
            {"tile_sample_min_height": tile[0] * spatial_scale, "tile_sample_min_width": tile[1] * spatial_scale},
        )
