"""Tiled decode with upstream's tiles and blending, equal-shape tiles batched: what every family's tile batching shares.

Upstream's ``tiled_decode`` cuts the latent frame into overlapping tiles
(stepping by less than the tile size), decodes each tile on its own (each
with its own frame batches and caches), then blends every tile into its
upper and left neighbours and crops. Traced into one jit that is one decoder
per tile: a 480x720 frame with CogVideoX's default 240x360 tiles is 3 x 3
tiles, 1920x1080 is dozens.

Here the grid, the blending and the crop are upstream's, but tiles of the
same shape (interior, right edge, bottom edge, corner: at most four shapes)
are stacked along the batch and decoded together, ``tiles_per_step`` at a
time as the steps of one `jax.lax.scan` (`decode_tiles`,
`decode_tile_group`). The program holds one decoder per tile *shape*,
whatever the tile count, and memory is that of ``tiles_per_step`` tiles.
The decoder is per sample, so stacking changes no result; blending is the
same arithmetic as upstream's in-place loop. Each family's tile-batching
patch reads its own tiling attributes and calls these.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from cogvideox_torchax.patches.base import add_mixin, interop, torchax


def blend(a: jax.Array, b: jax.Array, extent: int, axis: int) -> jax.Array:
    """``b`` with its first rows along ``axis`` faded in from ``a``'s last rows.

    Upstream's ``blend_v`` (axis 3) / ``blend_h`` (axis 4): over
    ``n = min(extent, a's size, b's size)`` rows, row ``y`` of ``b`` becomes
    ``a[-n + y] * (1 - y / n) + b[y] * (y / n)``; the rest of ``b`` is kept.
    """
    n = min(a.shape[axis], b.shape[axis], extent)
    if n <= 0:
        return b
    y = np.arange(n, dtype=np.float64)
    shape = [1] * b.ndim
    shape[axis] = n
    # The weights are computed in double and rounded once, as torch rounds
    # the Python float scalars upstream multiplies by.
    w_a = jnp.asarray((1 - y / n).astype(np.float32).reshape(shape))
    w_b = jnp.asarray((y / n).astype(np.float32).reshape(shape))
    a_tail = jax.lax.slice_in_dim(a, a.shape[axis] - n, a.shape[axis], axis=axis).astype(jnp.float32)
    b_head = jax.lax.slice_in_dim(b, 0, n, axis=axis).astype(jnp.float32)
    mixed = (a_tail * w_a + b_head * w_b).astype(b.dtype)
    return jnp.concatenate([mixed, jax.lax.slice_in_dim(b, n, b.shape[axis], axis=axis)], axis=axis)


def decode_tiles(z: torch.Tensor, tile: tuple[int, int], step: tuple[int, int], extent: tuple[int, int],
                 keep: tuple[int, int], decode_group) -> torch.Tensor:
    """Upstream's tile grid over ``z``'s latent frame, decoded by shape group, blended and joined.

    Tiles of ``tile`` latents start every ``step`` latents (cut short at the
    edges); ``decode_group(stacked, count)`` decodes the tiles of one shape
    stacked on the batch; each decoded tile fades in from its upper and left
    neighbours over ``extent`` pixels (`blend`), keeps its first ``keep``
    pixels, and the kept parts are joined. Every family's tile batching
    shares it.
    """
    batch, _, _, height, width = z.shape
    rows, cols = list(range(0, height, step[0])), list(range(0, width, step[1]))

    # Group tile positions by tile shape (edge tiles are cut short).
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in rows:
        for j in cols:
            shape = (min(tile[0], height - i), min(tile[1], width - j))
            groups.setdefault(shape, []).append((i, j))

    decoded: dict[tuple[int, int], torch.Tensor] = {}
    for positions in groups.values():
        tiles = [z[:, :, :, i : i + tile[0], j : j + tile[1]] for i, j in positions]
        video = decode_group(torch.cat(tiles, dim=0), len(positions))
        for n, pos in enumerate(positions):
            decoded[pos] = video[n * batch : (n + 1) * batch]

    # Upstream blends in place, row by row: each tile fades in from its
    # already-blended upper and left neighbours.
    blend_v = interop.torch_view(functools.partial(blend, extent=extent[0], axis=3))
    blend_h = interop.torch_view(functools.partial(blend, extent=extent[1], axis=4))
    blended: dict[tuple[int, int], torch.Tensor] = {}
    out_rows = []
    for ri, i in enumerate(rows):
        out_row = []
        for ci, j in enumerate(cols):
            video = decoded[(i, j)]
            if ri > 0:
                video = blend_v(blended[(rows[ri - 1], j)], video)
            if ci > 0:
                video = blend_h(blended[(i, cols[ci - 1])], video)
            blended[(i, j)] = video
            out_row.append(video[:, :, :, : keep[0], : keep[1]])
        out_rows.append(torch.cat(out_row, dim=4))
    return torch.cat(out_rows, dim=3)


def decode_tile_group(decode, stacked: torch.Tensor, count: int, tiles_per_step: int) -> torch.Tensor:
    """``decode`` of ``count`` same-shape tiles stacked on the batch, ``tiles_per_step`` at a time as scan steps.

    ``decode`` takes a batch of tiles and returns their videos, stacked the
    same way. Every family's tile batching shares it.
    """
    per_step = max(1, min(tiles_per_step, count))
    batch = stacked.shape[0] // count
    if per_step >= count:
        return decode(stacked)
    env = torchax.default_env()
    steps = -(-count // per_step)
    xs = env.t2j_iso(stacked)
    pad = steps * per_step - count
    if pad:  # repeat the last tile; its extra decodes are dropped below
        xs = jnp.concatenate([xs, jnp.repeat(xs[-batch:], pad, axis=0)], axis=0)
    xs = xs.reshape(steps, per_step * batch, *xs.shape[1:])

    def body(carry, chunk):
        return carry, env.t2j_iso(decode(env.j2t_iso(chunk)))

    _, videos = jax.lax.scan(body, None, xs)  # (steps, per_step * B, 3, F, h, w)
    videos = videos.reshape(steps * per_step * batch, *videos.shape[2:])[: count * batch]
    return env.j2t_iso(videos)


def add_batching(vae: torch.nn.Module, mixin: type, attribute: str, per_step: int) -> int:
    """Puts a batching ``mixin`` on ``vae`` and sets ``attribute``: how many tiles (or windows) one scan step decodes.

    Every family's tile batching (and HunyuanVideo's frame windows) applies itself so.

    Returns:
        1 if ``vae``'s class changed in this call, else 0 (``attribute`` is set either way).

    Raises:
        ValueError: ``per_step`` below 1.
    """
    if per_step < 1:
        raise ValueError(f"{attribute} must be >= 1, got {per_step}")
    changed = add_mixin(vae, mixin)
    setattr(vae, attribute, int(per_step))
    return changed
