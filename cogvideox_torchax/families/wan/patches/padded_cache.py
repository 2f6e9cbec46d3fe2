"""Wan's causal convolutions with a cache: the padded input written once, the next cache cut from it.

Upstream slices each causal convolution's next cache from its activated
input (``x[:, :, -2:].clone()`` in `WanResidualBlock`, `WanResample` and
the decoder's head and tail) and then calls the convolution, which joins
the previous cache in front (``torch.cat``). The input then has two
readers, and XLA's GPU compiler writes it (the fused norm and SiLU) and
copies it again behind the cache for the convolution: three quarters of
the data movement of a Wan 2.1 decode's H200 program.

Here, whenever the decoder runs with a convolution's two-frame cache
(every call after the first chunk), that causal convolution joins its
cache and its input behind an optimization barrier and cuts the next
cache from the joined input, and the decoder hands those caches on
instead of upstream's slices. They are the same values: the joined
input's last two frames are upstream's cache whether the input has one
frame (upstream then joins the old cache's last frame itself) or more.
Upstream's slices, no longer read, are dropped by the compiler, and the
join is the input's only reader, which the norm and SiLU then write
directly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan, WanCausalConv3d, WanDecoder3d

from cogvideox_torchax.patches.base import Patch, add_mixin, interop, is_torchax


def _join(x: jax.Array, cache: jax.Array, *, halo: int) -> tuple[jax.Array, jax.Array]:
    # The join behind a barrier of its own, so that the cut is read from it,
    # not simplified back into a slice of x (a second reader of x).
    joined = jax.lax.optimization_barrier(jnp.concatenate([cache.astype(x.dtype), x], axis=2))
    return jax.lax.optimization_barrier((joined, joined[:, :, -halo:]))


class PaddedCacheCausalConv:
    """Mixin for `WanCausalConv3d`: given a full cache while its decoder collects, the next cache cut from the join.

    ``_taken`` (set by `PaddedCacheDecoder` for one call) maps the identity
    of each cache handed in to ``(that cache, the cache cut after it)``.
    """

    _taken: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        halo = self._padding[4]
        taken = self._taken
        if taken is None or not is_torchax(x) or not isinstance(cache_x, torch.Tensor) or cache_x.shape[2] != halo:
            return super().forward(x, cache_x)
        joined, cut = interop.torch_view(functools.partial(_join, halo=halo))(x, cache_x)
        taken[id(cache_x)] = (cache_x, cut)  # the cache held: no other object takes its identity meanwhile
        padding = list(self._padding)
        padding[4] = 0  # the cache fills the time padding, as upstream's join does
        return self._conv_forward(F.pad(joined, padding), self.weight, self.bias)


class _CutCaches(list):
    """A decoder call's cache list: an entry upstream overwrites after handing it to a convolution takes that
    convolution's cut instead of upstream's slice.

    Upstream writes ``x = conv(x, feat_cache[idx]); feat_cache[idx] = cache_x``
    (and `tail_chunks` twice per entry, the second call handed the first's
    cache), so the entry being overwritten is the cache the convolution
    was handed.
    """

    def __init__(self, caches: list, taken: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        super().__init__(caches)
        self._taken = taken

    def __setitem__(self, index, value):
        if isinstance(index, int):
            handed, cut = self._taken.pop(id(self[index]), (None, None))
            if handed is not None and handed is self[index]:
                value = cut
        super().__setitem__(index, value)


class PaddedCacheDecoder:
    """Mixin for `WanDecoder3d`: each cache its convolutions cut replaces upstream's slice (`_CutCaches`)."""

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):  # noqa: B006 (upstream's)
        if feat_cache is None or not is_torchax(x):
            return super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)
        taken: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        caches = _CutCaches(feat_cache, taken)
        convs = [m for m in self.modules() if isinstance(m, PaddedCacheCausalConv)]
        for m in convs:
            m._taken = taken
        try:
            out = super().forward(x, feat_cache=caches, feat_idx=feat_idx, first_chunk=first_chunk)
        finally:
            for m in convs:
                m._taken = None
        feat_cache[:] = caches  # upstream's caller reads the list it passed
        return out


def apply_padded_cache(vae: AutoencoderKLWan) -> int:
    """Gives the decoder `PaddedCacheDecoder` and its time-padded causal convolutions `PaddedCacheCausalConv`.

    Returns:
        How many modules changed class in this call (0 on a second call).
    """
    count = 0
    for module in vae.modules():
        if isinstance(module, WanDecoder3d):
            count += add_mixin(module, PaddedCacheDecoder)
            for conv in module.modules():
                if isinstance(conv, WanCausalConv3d) and conv._padding[4] > 0:
                    count += add_mixin(conv, PaddedCacheCausalConv)
    return count


PATCHES = (
    Patch(
        "wan_padded_cache", "loops",
        "In every decoder call after the first chunk, each causal convolution joins its cache behind an optimization "
        "barrier and cuts the next cache from the join, which the decoder hands on instead of upstream's "
        "slice of the input: the input has one reader, and the norm and SiLU write the padded input once "
        "(`padded_cache.PaddedCacheCausalConv`). CUDA only.",
        lambda m, plan, mesh: apply_padded_cache(m),
        families=("wan",),
        platforms=("cuda",),
        platforms_why="measured on CUDA only (compiled for an H200)",
        after=("wan_frame_scan", "wan_tail_chunks"),  # in front of the tail's forward, which calls no super()
    ),
)
