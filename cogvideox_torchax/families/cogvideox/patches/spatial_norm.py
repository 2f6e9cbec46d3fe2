"""SpatialNorm's 1x1x1 convolutions at latent size, before the resize (`LowResSpatialNorm3D`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d, CogVideoXSpatialNorm3D

from cogvideox_torchax.config import canonical_dtype
from cogvideox_torchax.kernels.upsample import (
    first_frame_apart_indices,
    gather_indices,
    nearest_indices,
    take_indices,
)
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, swap_classes
from cogvideox_torchax.patches.conv import FusedBiasConv


def _take_axes(x: jax.Array, indices: tuple[np.ndarray, ...]) -> jax.Array:
    # Gathers, not `take_indices`' repeats: XLA GPU fuses a gather of the
    # latent-size scale into the norm's multiply-add; the repeats' reshape
    # it stored at full size (1.5 headline, H200: 15.42 -> 16.08 GiB).
    for axis, idx in enumerate(indices, start=2):
        if not np.array_equal(idx, np.arange(x.shape[axis])):
            x = gather_indices(x, idx, axis)
    return x


def _upstream_indices(small: tuple[int, ...], full: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Upstream's nearest resize of zq to f's (T, H, W), as the indices of one gather per axis.

    Upstream resizes the first frame on its own when f has an odd number of
    frames above one, and concatenates; written as index arrays there is no
    concatenation to materialise (a width-sharded program did, at full size).
    """
    return (_time_indices(small[2], full[2]), *(nearest_indices(small[a], full[a]) for a in (3, 4)))


def _scale_shift_resized(normed: torch.Tensor, y: torch.Tensor, b: torch.Tensor, indices,
                         dtype: torch.dtype) -> torch.Tensor:
    """``normed * resize(y) + resize(b)`` in ``y``'s dtype, rounded to ``dtype``: upstream's arithmetic.

    One JAX function rather than six torch ops: the same operations, traced
    without torchax's per-op dispatch (72 norms in the 2b decode's trace).
    """
    out = jnp.dtype(canonical_dtype(dtype))

    def scale_shift(normed, y, b):
        return (normed.astype(y.dtype) * _take_axes(y, indices) + _take_axes(b, indices)).astype(out)

    return interop.torch_view(scale_shift)(normed, y, b)


def _time_indices(t_in: int, t_out: int) -> np.ndarray:
    # Upstream resizes the first frame alone when there is an odd number above one.
    if t_out > 1 and t_out % 2 == 1:
        return first_frame_apart_indices(t_in, t_out)
    return nearest_indices(t_in, t_out)


def _blocks_of(small: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, int] | None:
    """``(rh, rw)`` when upstream's nearest resize of H and W from ``small`` to ``full`` repeats each value rh x rw."""
    ratios = []
    for a in (3, 4):
        r = full[a] // small[a]
        if r < 1 or r * small[a] != full[a] or not np.array_equal(
            nearest_indices(small[a], full[a]), np.arange(full[a]) // r
        ):
            return None
        ratios.append(r)
    return ratios[0], ratios[1]


def _block_scale_shift(normed: jax.Array, y: jax.Array, b: jax.Array) -> jax.Array:
    """``normed * resize(y) + resize(b)`` (upstream's nearest resize), in ``y``'s dtype, rounded to ``normed``'s.

    Time is gathered at latent resolution and width repeated at latent
    height (1/rh of the full size); the height repeat is a broadcast over
    the activation split as (h, rh), so no full-size scale or shift exists.
    The barrier stores the normalised input once in its own dtype: without
    it the TPU compiler stored its fp32 upcast and a relayouted copy of that.
    """
    t_idx = _time_indices(y.shape[2], normed.shape[2])
    rh, rw = _blocks_of(y.shape, normed.shape)
    y, b = (jnp.repeat(take_indices(v, t_idx, 2), rw, axis=4)[:, :, :, :, None] for v in (y, b))
    n, c, t, h, _, w = y.shape
    x = jax.lax.optimization_barrier(normed).reshape(n, c, t, h, rh, w)
    return (x.astype(y.dtype) * y + b).reshape(normed.shape).astype(normed.dtype)


def _is_pointwise(conv: CogVideoXCausalConv3d) -> bool:
    c = conv.conv
    return tuple(c.kernel_size) == (1, 1, 1) and tuple(c.stride) == (1, 1, 1) and tuple(c.padding) == (0, 0, 0)


class LowResSpatialNorm3D(CogVideoXSpatialNorm3D):
    """`CogVideoXSpatialNorm3D` with ``conv_y``/``conv_b`` applied before the resize, under torchax.

    Upstream resizes ``zq`` (latent size, 16 channels) to the feature map's
    size and then applies two 1x1x1 convolutions to it: two full-size
    tensors with the feature map's channel count, 2 x 3 GiB at 480x720, 256
    channels, 9 frames in fp32, alive together at the decode's memory peak.
    A 1x1x1 convolution acts on each position alone and a nearest resize
    only repeats positions, so the two commute: here the convolutions run on
    ``zq`` at its own size and the resize of their outputs (one gather per
    axis) fuses into the norm's multiply-add. The values are upstream's; the work
    of the two convolutions shrinks by the resize factor.

    In bf16, with the convolutions on `kernels.conv` (`apply_conv_bias`),
    the scale and shift are computed in fp32 from ``zq`` and the norm's
    multiply-add rounds once: at latent resolution they cost next to
    nothing. This buys back what a GPU or TPU plan loses by adding conv
    biases after rounding (tiny config, seeds 0-5: from up to 2.0 dB below
    upstream torch's bf16 decode to at most 0.44 dB below, against fp32).

    Measured at 49 frames 480x720 (2b, fp32, one device, memory-optimized
    scheduler): 15.63 -> 14.37 GiB of compiled temporary memory.

    With ``block_broadcast`` (the TPU plan) the resize is written so that
    nothing full-size is gathered (`_block_scale_shift`): XLA's TPU
    compiler does not fuse a gather into its consumer, so the resized fp32
    scale and shift were stored at full size (CogVideoX 1.5 headline, one
    v6e chip: 6 x 2.66 GiB at the peak), next to an fp32 copy of the
    normalised input (7.97 GiB). Same values.
    """

    block_broadcast: bool = False

    def forward(self, f: torch.Tensor, zq: torch.Tensor, conv_cache: dict[str, torch.Tensor] | None = None):
        if not is_torchax(f) or not (_is_pointwise(self.conv_y) and _is_pointwise(self.conv_b)):
            return super().forward(f, zq, conv_cache)
        y, b, new_conv_cache = self._scale_shift(zq, conv_cache)
        normed = self.norm_layer(f)
        if self.block_broadcast and _blocks_of(y.shape, f.shape) is not None:
            return interop.torch_view(_block_scale_shift)(normed, y, b), new_conv_cache
        return _scale_shift_resized(normed, y, b, _upstream_indices(y.shape, tuple(f.shape)), f.dtype), new_conv_cache

    def _scale_shift(self, zq: torch.Tensor, conv_cache: dict[str, torch.Tensor] | None):
        # Scale and shift at latent size, and their convs' caches. Our conv
        # kernel casts the weights to the input's dtype; torchax's own
        # lowering would not, so without it zq stays as it is.
        conv_cache = conv_cache or {}
        new_conv_cache = {}
        fp32 = isinstance(self.conv_y.conv, FusedBiasConv) and isinstance(self.conv_b.conv, FusedBiasConv)
        zq_in = zq.float() if fp32 else zq
        y, new_conv_cache["conv_y"] = self.conv_y(zq_in, conv_cache=conv_cache.get("conv_y"))
        b, new_conv_cache["conv_b"] = self.conv_b(zq_in, conv_cache=conv_cache.get("conv_b"))
        return y, b, new_conv_cache

    def frames(self, f: torch.Tensor, zq: torch.Tensor, conv_cache: dict[str, torch.Tensor] | None = None, *,
               by_frame: bool = True):
        """``forward`` frame range by frame range: ``(FrameNorm, new_conv_cache)``.

        The `FrameNorm`'s ``(start, stop)`` is ``forward(f, zq)[0][:, :,
        start:stop]``, computed from those frames of ``f`` alone (the group
        norm's statistics over all of ``f`` are taken once, here, frame by
        frame with ``by_frame``: `kernels.group_norm.group_norm_statistics`).
        None where ``forward`` would not run this way (eagerly, without
        `group_norm.JaxGroupNorm`, or with ``block_broadcast``).
        """
        if (not is_torchax(f) or self.block_broadcast or not hasattr(self.norm_layer, "statistics")
                or not (_is_pointwise(self.conv_y) and _is_pointwise(self.conv_b))):
            return None, None
        y, b, new_conv_cache = self._scale_shift(zq, conv_cache)
        return FrameNorm(self.norm_layer, f, self.norm_layer.statistics(f, by_frame=by_frame), y, b), new_conv_cache


class FrameNorm:
    """`LowResSpatialNorm3D` of one input, by frame ranges: ``norm(start, stop)``.

    ``statistics`` (the group norm's, small) may be replaced by the same
    values passed through a barrier, to order the ranges' computations.
    """

    def __init__(self, norm_layer, f: torch.Tensor, statistics, y: torch.Tensor, b: torch.Tensor) -> None:
        self.norm_layer, self.f, self.statistics, self.y, self.b = norm_layer, f, statistics, y, b

    def __call__(self, start: int, stop: int) -> torch.Tensor:
        normed = self.norm_layer.apply(self.f[:, :, start:stop], self.statistics)
        time, *space = _upstream_indices(self.y.shape, tuple(self.f.shape))
        return _scale_shift_resized(normed, self.y, self.b, (time[start:stop], *space), self.f.dtype)


def apply_low_res_spatial_norm(vae: torch.nn.Module, *, block_broadcast: bool = False) -> int:
    """Makes every `CogVideoXSpatialNorm3D` in ``vae`` a `LowResSpatialNorm3D`.

    ``block_broadcast``: resize the scale and shift without a full-size
    gather (see `LowResSpatialNorm3D`); set on every such module.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = swap_classes(vae, {CogVideoXSpatialNorm3D: LowResSpatialNorm3D})
    for module in vae.modules():
        if isinstance(module, LowResSpatialNorm3D):
            module.block_broadcast = block_broadcast
    return count


def _low_res_why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.tp > 1:
        # Measured at tp=8 (2b, 49 frames at 480x720, fp32): 2.15 GiB per
        # device with the patch, 2.12 without.
        return "under width sharding (tp > 1) the resize crosses shards and is materialised anyway"
    return None


PATCHES = (
    Patch(
        "low_res_spatial_norm", "layers",
        "SpatialNorm's 1x1x1 ``conv_y``/``conv_b`` run on ``zq`` before its nearest resize, not after "
        "(`spatial_norm.LowResSpatialNorm3D`): the same values without two full-size tensors per norm. Meshes with "
        "``tp=1`` only.",
        lambda m, plan, mesh: apply_low_res_spatial_norm(m, block_broadcast=plan.placement.profile.block_broadcast),
        families=("cogvideox",),
        why_not=_low_res_why_not,
    ),
)
