"""Upstream's causal convolutions, three ways: no cache for time kernel 1, cache taken first, time taps."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

from cogvideox_torchax.kernels.causal_conv import causal_conv3d
from cogvideox_torchax.patches.base import Patch, barrier, interop, is_torchax, keep_barriers, swap_classes


class CachelessCausalConv3d(CogVideoXCausalConv3d):
    """A `CogVideoXCausalConv3d` with a time kernel of 1, returning no cache.

    Upstream returns ``inputs[:, :, -kernel + 1:]`` as the cache, which for a
    kernel of 1 is the *whole* input (``-0:``), and never reads it back (only
    kernels > 1 prepend a cache). SpatialNorm's ``conv_y``/``conv_b`` are such
    convs: for 49 frames at 480x720 their caches alone were 10 GB. Returning
    None instead changes no result and gives later frame batches a cache of
    the same shape as the first's, which a scan carry needs. Nor is the
    cache sliced and copied only to be dropped: ~300 torch ops through
    torchax's dispatch in the 2b decode's trace (no JAX op), 0.05 of its
    0.44 s.
    """

    def forward(self, inputs: torch.Tensor, conv_cache: torch.Tensor | None = None):
        if self.pad_mode == "replicate":
            return super().forward(inputs, conv_cache)[0], None
        return self.conv(self.fake_context_parallel_forward(inputs, conv_cache)), None


def apply_conv_cache_trim(vae: torch.nn.Module) -> int:
    """Makes every time-kernel-1 `CogVideoXCausalConv3d` a `CachelessCausalConv3d`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return swap_classes(vae, {CogVideoXCausalConv3d: CachelessCausalConv3d}, lambda m: m.time_kernel_size == 1)



class CacheFirstCausalConv3d(CogVideoXCausalConv3d):
    """A `CogVideoXCausalConv3d` (time kernel > 1) that takes its conv cache before convolving.

    Upstream returns ``inputs[:, :, -k + 1:]`` of the cache-padded input as
    the next frame batch's cache. Traced into one program, nothing orders
    that small slice: XLA fuses it with the elementwise ops producing the
    input (norm, SiLU) and schedules it late, at the end of the decoder call
    or inside the next call's concatenation, so every full-size tensor those
    ops read (the norm input, SpatialNorm's ``conv_y``/``conv_b`` outputs,
    the SiLU gate) stays alive until then: 92 GB instead of ~13 GB at
    480x720 (2b, fp32) as soon as two decoder calls are chained.

    Here a barrier on ``(input, cache)`` makes the convolution wait for the
    cache: the cache exists before the input can die, and it is a copy of
    two frames, not a view of the batch. The values are upstream's. The
    input itself is not put behind a barrier (materialised): that saves no
    memory (16.90 GiB either way at 13 frames, 480x720) and makes the
    scanned decode 2.2x slower on XLA:CPU (2b, (1,16,5,8,8): 46 s vs 22 s).

    With ``materialise_padded`` (CUDA and TPU: their convolutions read the
    input from memory anyway) the barrier is on ``(padded input, cache)``
    instead, and the cache is a slice of the padded copy; on one v6e chip
    it is part of the TPU plan's 42.19 -> 21.33 GiB (`platforms.run_plan`).

    With ``cache_from_padded`` (`apply_padded_cache`, CUDA) the padded
    input goes behind a barrier of its own and the cache is sliced from it
    after. Sliced before, XLA reads the slice from the input, which then
    has two readers, and the GPU compiler writes the input (the fused norm
    and SiLU) and copies it into the padded buffer. With one reader the
    norm and SiLU write the padded buffer themselves. The first batch's
    padding (its first frame twice) is a zero pad, which XLA fuses into
    the producer where a concatenation reading the input three times was
    not, with the first frame copied over the zeros in place (what it
    saves: docs/results/h200-padded-inputs-2026-11-29.md).
    """

    materialise_padded: bool = False
    cache_from_padded: bool = False

    def forward(self, inputs: torch.Tensor, conv_cache: torch.Tensor | None = None):
        if not is_torchax(inputs) or self.pad_mode == "replicate":
            return super().forward(inputs, conv_cache)
        fn = functools.partial(_cache_first, halo=self.time_kernel_size - 1, materialise_padded=self.materialise_padded,
                               cache_from_padded=self.cache_from_padded)
        padded, new_cache = interop.torch_view(fn)(inputs, conv_cache)
        return self.conv(padded), new_cache


def _cache_first(x: jax.Array, cache: jax.Array | None, *, halo: int, materialise_padded: bool,
                 cache_from_padded: bool = False):
    """``(padded input, new cache)`` of upstream's causal conv, the cache taken before the convolution.

    Upstream's padding (the cache, or the first frame ``halo`` times) and
    its cache (the padded input's last ``halo`` frames), in JAX: one
    function instead of five torch ops per conv in the trace.
    """
    def padded(x):
        head = [cache] if cache is not None else [x[:, :, :1]] * halo
        return jnp.concatenate([*head, x], axis=2)

    if cache_from_padded:
        if cache is None:
            # Zero frames in front (fused into x's producer), then the first frame copied over them.
            whole = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0), (halo, 0, 0), (0, 0, 0), (0, 0, 0)])
            first = jax.lax.slice_in_dim(whole, halo, halo + 1, axis=2)
            whole = jax.lax.dynamic_update_slice(whole, jnp.repeat(first, halo, axis=2), (0, 0, 0, 0, 0))
        else:
            whole = padded(x)
        whole = jax.lax.optimization_barrier(whole)
        return jax.lax.optimization_barrier((whole, whole[:, :, -halo:]))
    whole = padded(x)
    new_cache = whole[:, :, -halo:]
    if materialise_padded:
        return jax.lax.optimization_barrier((whole, new_cache))
    x, new_cache = jax.lax.optimization_barrier((x, new_cache))
    return padded(x), new_cache


def apply_cache_first(vae: torch.nn.Module, *, materialise_padded: bool = False) -> int:
    """Makes every time-kernel > 1 `CogVideoXCausalConv3d` a `CacheFirstCausalConv3d`.

    ``materialise_padded``: the barrier holds the padded input rather than
    the input (see `CacheFirstCausalConv3d`); set on every such module.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = swap_classes(vae, {CogVideoXCausalConv3d: CacheFirstCausalConv3d}, lambda m: m.time_kernel_size > 1)
    for module in vae.modules():
        if isinstance(module, CacheFirstCausalConv3d):
            module.materialise_padded = materialise_padded
    return count


def apply_padded_cache(vae: torch.nn.Module) -> int:
    """Makes every `CacheFirstCausalConv3d` cut its cache from its padded input (``cache_from_padded``).

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = 0
    for module in vae.modules():
        if isinstance(module, CacheFirstCausalConv3d) and not module.cache_from_padded:
            module.cache_from_padded = True
            count += 1
    return count


def _time_taps_apply(module: CogVideoXCausalConv3d) -> bool:
    # Only the conv's structure is checked here; which backends and dtypes
    # get time taps at all is `cogvideox_torchax.platforms.run_plan`'s decision.
    conv3d = module.conv
    return (
        module.pad_mode != "replicate"  # any other mode prepends the cache
        and tuple(conv3d.stride) == (1, 1, 1)
        and tuple(conv3d.dilation) == (1, 1, 1)
        and conv3d.groups == 1
        and conv3d.padding_mode == "zeros"
        and not isinstance(conv3d.padding, str)
        and conv3d.padding[0] == 0
    )


class TimeTapCausalConv3d(CacheFirstCausalConv3d):
    """A `CacheFirstCausalConv3d` run as one 2-D convolution per time tap.

    `kernels.causal_conv.causal_conv3d` convolves each batch's own frames
    once per time tap and carries partial sums of the next batch's first
    outputs as the conv cache, instead of input frames: XLA:CPU's 2-D
    convolutions run ~1.5x faster than its 3-D one, and no padded copy of
    the input is built. The cache stays opaque to upstream's code, which
    only hands it back to the same module. `cogvideox_torchax.platforms.run_plan` applies
    it on the CPU in fp32 only.

    A barrier on ``(output, cache)`` makes both exist together: left free,
    the scheduler may postpone the small cache sums to the next batch, and
    every tap's full-size product they read would stay alive until then.

    ``cache_inputs`` and ``in_order`` are the kernel's options of the
    same names; `apply_time_tap_conv` sets them on the encoder's convs.
    """

    cache_inputs: bool = False
    in_order: bool = False

    def forward(self, inputs: torch.Tensor, conv_cache: torch.Tensor | None = None):
        if not is_torchax(inputs) or not _time_taps_apply(self):
            return super().forward(inputs, conv_cache)
        options = {}
        if self.cache_inputs:
            options["cache_inputs"] = True
        if self.in_order:
            options["in_order"] = True
        fn = functools.partial(causal_conv3d, padding_hw=tuple(self.conv.padding[1:]), **options)
        output, state = interop.torch_view(fn)(inputs, conv_cache, self.conv.weight, self.conv.bias)
        return barrier((output, state))


def apply_time_tap_conv(vae: torch.nn.Module) -> int:
    """Makes every `CacheFirstCausalConv3d` a `TimeTapCausalConv3d`; apply `apply_cache_first` first.

    In the encoder (``vae.encoder``, where there is one), whose caches a
    scanned encode carries across its frame batches (3.34 GiB at 480x720
    in fp32, six full-resolution ones at 128 channels), each conv also adds
    the carried state and then each tap's product before the next tap
    (``in_order``), and a conv with fewer input than output channels
    carries its input frames (``cache_inputs``): ``conv_in`` 3 channels
    instead of 128. Compiled temp of the 2b encode at 480x720 (fp32,
    default XLA:CPU scheduler), 9 / 49 frames: 7.42 / 10.26 GiB; 7.42 /
    11.25 without ``in_order`` (in the scan step, two full-size products
    alive at once). The decoder's convs are left free: in_order on them
    leaves the decode of 13 latent frames at 480x720 at the same 14.08 GiB.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = swap_classes(vae, {CacheFirstCausalConv3d: TimeTapCausalConv3d})
    encoder = getattr(vae, "encoder", None)
    for module in encoder.modules() if isinstance(encoder, torch.nn.Module) else ():
        if isinstance(module, TimeTapCausalConv3d):
            module.in_order = True
            module.cache_inputs = module.conv.in_channels < module.conv.out_channels
    return count


def _time_taps_why_not(placement, applied: frozenset[str]) -> str | None:
    if placement.dtype != "float32":
        return "in bf16 and fp16 its per-tap fp32 partial sums would be activation-sized fp32 tensors"
    return None


PATCHES = (
    Patch(
        "trim_conv_cache", "layers",
        "Time-kernel-1 causal convs return no conv cache (upstream returns, and never reads, their whole input).",
        lambda m, plan, mesh: apply_conv_cache_trim(m),
        families=("cogvideox",),
    ),
    Patch(
        "cache_first", "layers",
        "Causal convs take their conv cache before convolving, ordered by optimization barriers "
        "(`causal_conv.CacheFirstCausalConv3d`), so chained decoder calls do not keep each call's full-size "
        "activations alive (92 GB instead of ~16 GB at 49 frames 480x720).",
        lambda m, plan, mesh: apply_cache_first(m, materialise_padded=plan.placement.profile.materialise_padded),
        families=("cogvideox",),
        # Both swap causal convs by exact class: the trimmed ones first.
        after=("trim_conv_cache",),
        compiler_options=keep_barriers,
    ),
    Patch(
        "padded_cache", "layers",
        "Causal convs cut their conv cache from their padded input, behind a barrier of its own, so that the "
        "input has one reader and the norm and SiLU write the padded input once instead of writing the input "
        "and copying it (`causal_conv.CacheFirstCausalConv3d`). CUDA only.",
        lambda m, plan, mesh: apply_padded_cache(m),
        families=("cogvideox",),
        platforms=("cuda",),
        platforms_why="measured on CUDA only (compiled for an H200)",
        requires=("cache_first",),
    ),
    Patch(
        "time_tap_conv", "layers",
        "Causal convs run as one 2-D convolution per time tap and carry partial sums as their conv cache "
        "(`causal_conv.TimeTapCausalConv3d`, ~1.5x faster convs on XLA:CPU). CPU and fp32 only.",
        lambda m, plan, mesh: apply_time_tap_conv(m),
        families=("cogvideox",),
        platforms=("cpu",),
        platforms_why="GPU and TPU run each causal conv as one 3-D convolution; time taps only work around "
                      "XLA:CPU's slow 3-D convolution",
        requires=("cache_first",),
        why_not=_time_taps_why_not,
    ),
)
