"""Runtime patches of a built upstream `AutoencoderKLCogVideoX`.

Nothing here edits diffusers' source or its classes. Each ``apply_*`` function
changes one concern on one module instance, is idempotent, and leaves the
parameters and state-dict keys as they were. Patched modules still run as
upstream when called eagerly with ordinary torch tensors; the JAX paths only
engage for torchax tensors, i.e. inside our jitted decode.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import (
    CogVideoXCausalConv3d,
    CogVideoXSafeConv3d,
    CogVideoXSpatialNorm3D,
)
from diffusers.models.upsampling import CogVideoXUpsample3D
from jax.sharding import Mesh

from cogvideox_torchax import sharding
from cogvideox_torchax._torch_compat import import_torchax

torchax = import_torchax()
from torchax import interop  # noqa: E402  (torchax must come through the shim)

from cogvideox_torchax.kernels.causal_conv import causal_conv3d  # noqa: E402
from cogvideox_torchax.kernels.conv import ConvPolicy, conv  # noqa: E402
from cogvideox_torchax.kernels.group_norm import group_norm  # noqa: E402
from cogvideox_torchax.kernels.silu import silu  # noqa: E402
from cogvideox_torchax.kernels.upsample import nearest, nearest_indices  # noqa: E402


def is_torchax(x: Any) -> bool:
    """Whether ``x`` is a torchax tensor, i.e. we are inside our traced call (patches act only then)."""
    return isinstance(x, (torchax.tensor.Tensor, torchax.view.View))


# One class per (mixin, class) pair, made on first use: loop-level patches
# (frame_scan, tiling) compose in any order without a class per combination.
_COMPOSED: dict[tuple[type, type], type] = {}


def add_mixin(module: torch.nn.Module, mixin: type) -> int:
    """Puts ``mixin`` in front of ``module``'s class, keeping whatever patches that class has.

    Each mixin overrides its own methods and calls ``super()``, so any number
    compose in any order.

    Returns:
        1 if ``module``'s class changed, 0 if it already had ``mixin``.
    """
    if isinstance(module, mixin):
        return 0
    base = type(module)
    if (mixin, base) not in _COMPOSED:
        name = mixin.__name__.removesuffix("Mixin") + base.__name__
        _COMPOSED[mixin, base] = type(name, (mixin, base), {"__doc__": f"`{base.__name__}` with `{mixin.__name__}`."})
    module.__class__ = _COMPOSED[mixin, base]
    return 1


class ChunkFreeSafeConv3d(CogVideoXSafeConv3d):
    """`CogVideoXSafeConv3d` as the single convolution it computes.

    Upstream splits inputs over 2 GB (counted as if 2-byte elements) into time
    chunks with overlapping halos, a cuDNN workaround. Under XLA that only
    fragments one convolution into several and concatenates them; the result
    is the same, so we run the plain `nn.Conv3d` forward.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.nn.Conv3d.forward(self, input)


class _FusedBiasConv:
    """Mixin: `_conv_forward` by `kernels.conv.conv` under torchax, as its `conv_policy` says.

    The policy (layout, where the bias is added, the split size) is the
    module's ``conv_policy`` attribute, set by `apply_conv_bias`.
    Overriding `_conv_forward`, not `forward`, keeps each class's own
    forward: upstream's chunked `CogVideoXSafeConv3d` still chunks, each
    chunk going through the kernel.
    """

    conv_policy: ConvPolicy = ConvPolicy()

    def _conv_forward(self, input, weight, bias):
        if not is_torchax(input) or self.padding_mode != "zeros" or isinstance(self.padding, str):
            return super()._conv_forward(input, weight, bias)
        fn = functools.partial(
            conv,
            stride=tuple(self.stride),
            padding=tuple(self.padding),
            dilation=tuple(self.dilation),
            groups=self.groups,
            **self.conv_policy.kwargs(),
        )
        return interop.torch_view(fn)(input, weight, bias)


class JaxConv2d(_FusedBiasConv, torch.nn.Conv2d):
    """`nn.Conv2d` rounding once in bf16 (see `_FusedBiasConv`)."""


class JaxConv3d(_FusedBiasConv, torch.nn.Conv3d):
    """`nn.Conv3d` rounding once in bf16 (see `_FusedBiasConv`)."""


class JaxSafeConv3d(_FusedBiasConv, CogVideoXSafeConv3d):
    """Upstream's chunked `CogVideoXSafeConv3d`, each chunk rounding once."""


class JaxChunkFreeSafeConv3d(_FusedBiasConv, ChunkFreeSafeConv3d):
    """`ChunkFreeSafeConv3d` rounding once in bf16."""


class JaxGroupNorm(torch.nn.GroupNorm):
    """`nn.GroupNorm` computed by `kernels.group_norm.group_norm` under torchax."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not is_torchax(input):
            return super().forward(input)
        fn = functools.partial(group_norm, num_groups=self.num_groups, eps=self.eps)
        return interop.torch_view(fn)(input, self.weight, self.bias)


class JaxSiLU(torch.nn.SiLU):
    """`nn.SiLU` computed by `kernels.silu.silu` (one rounding) under torchax."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not is_torchax(input):
            return super().forward(input)
        return interop.torch_view(silu)(input)


def _swap_classes(
    vae: torch.nn.Module, swaps: dict[type, type], where: Callable[[torch.nn.Module], bool] | None = None
) -> int:
    count = 0
    for module in vae.modules():
        patched = swaps.get(type(module))
        if patched is not None and (where is None or where(module)):
            module.__class__ = patched
            count += 1
    return count


def _swap_class(vae: torch.nn.Module, base: type, patched: type) -> int:
    return _swap_classes(vae, {base: patched})


def apply_safe_conv(vae: torch.nn.Module) -> int:
    """Makes every `CogVideoXSafeConv3d` in ``vae`` a `ChunkFreeSafeConv3d`.

    Composes with `apply_conv_bias` in either order.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return _swap_classes(vae, {CogVideoXSafeConv3d: ChunkFreeSafeConv3d, JaxSafeConv3d: JaxChunkFreeSafeConv3d})


def apply_conv_bias(vae: torch.nn.Module, policy: ConvPolicy | None = None) -> int:
    """Makes every 2-D and 3-D convolution in ``vae`` run through `kernels.conv.conv` with ``policy``.

    The default policy adds the bias inside the fp32 accumulator (one
    rounding), channels-first, never split; `cogvideox_torchax.plan` picks
    one per backend. Covers `nn.Conv2d` (the upsamplers), `nn.Conv3d` and
    both kinds of `CogVideoXSafeConv3d`. Composes with `apply_safe_conv` in
    either order; calling it again sets the new policy.

    Returns:
        How many modules changed class in this call (0 on a second call).
    """
    count = _swap_classes(
        vae,
        {
            torch.nn.Conv2d: JaxConv2d,
            torch.nn.Conv3d: JaxConv3d,
            CogVideoXSafeConv3d: JaxSafeConv3d,
            ChunkFreeSafeConv3d: JaxChunkFreeSafeConv3d,
        },
    )
    for module in vae.modules():
        if isinstance(module, _FusedBiasConv):
            module.conv_policy = policy or ConvPolicy()
    return count


class CachelessCausalConv3d(CogVideoXCausalConv3d):
    """A `CogVideoXCausalConv3d` with a time kernel of 1, returning no cache.

    Upstream returns ``inputs[:, :, -kernel + 1:]`` as the cache, which for a
    kernel of 1 is the *whole* input (``-0:``), and never reads it back (only
    kernels > 1 prepend a cache). SpatialNorm's ``conv_y``/``conv_b`` are such
    convs: for 49 frames at 480x720 their caches alone were 10 GB. Returning
    None instead changes no result and gives later frame batches a cache of
    the same shape as the first's, which a scan carry needs.
    """

    def forward(self, inputs: torch.Tensor, conv_cache: torch.Tensor | None = None):
        output, _ = super().forward(inputs, conv_cache)
        return output, None


def apply_conv_cache_trim(vae: torch.nn.Module) -> int:
    """Makes every time-kernel-1 `CogVideoXCausalConv3d` a `CachelessCausalConv3d`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return _swap_classes(vae, {CogVideoXCausalConv3d: CachelessCausalConv3d}, lambda m: m.time_kernel_size == 1)


# XLA:CPU runs OptimizationBarrierExpander, which deletes every
# `optimization_barrier` before fusion and scheduling; the decode is compiled
# with this option so the barriers of `CacheFirstCausalConv3d` stay (GPU and
# TPU keep barriers anyway). See `TorchaxVAE.compile_decode`.
KEEP_BARRIERS_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse_barrier_expander"}

_barrier = interop.torch_view(jax.lax.optimization_barrier)


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

    With ``materialise_padded`` (CUDA: cuDNN reads its input from memory
    anyway) the barrier is on ``(padded input, cache)`` instead: the norm
    and SiLU producing the input fuse into the concatenation, so the input
    is never stored apart from its padded copy, and the cache is a slice of
    that copy. Compiled for an H200 (2b, (1,16,13,60,90), bf16): 6.44 vs
    6.74 GiB of temporaries, 13 vs 38 activation-sized copies.
    """

    materialise_padded: bool = False

    def forward(self, inputs: torch.Tensor, conv_cache: torch.Tensor | None = None):
        if not is_torchax(inputs) or self.pad_mode == "replicate":
            return super().forward(inputs, conv_cache)
        x = inputs
        padded = self.fake_context_parallel_forward(x, conv_cache)
        new_cache = padded[:, :, -self.time_kernel_size + 1 :].clone()
        if self.materialise_padded:
            padded, new_cache = _barrier((padded, new_cache))
            return self.conv(padded), new_cache
        x, new_cache = _barrier((x, new_cache))
        output = self.conv(self.fake_context_parallel_forward(x, conv_cache))
        return output, new_cache


def apply_cache_first(vae: torch.nn.Module, *, materialise_padded: bool = False) -> int:
    """Makes every time-kernel > 1 `CogVideoXCausalConv3d` a `CacheFirstCausalConv3d`.

    ``materialise_padded``: the barrier holds the padded input rather than
    the input (see `CacheFirstCausalConv3d`); set on every such module.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    count = _swap_classes(vae, {CogVideoXCausalConv3d: CacheFirstCausalConv3d}, lambda m: m.time_kernel_size > 1)
    for module in vae.modules():
        if isinstance(module, CacheFirstCausalConv3d):
            module.materialise_padded = materialise_padded
    return count


def _time_taps_apply(module: CogVideoXCausalConv3d) -> bool:
    # Only the conv's structure is checked here; which backends and dtypes
    # get time taps at all is `cogvideox_torchax.plan`'s decision.
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
    only hands it back to the same module. `cogvideox_torchax.plan` applies
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
        return _barrier((output, state))


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
    count = _swap_class(vae, CacheFirstCausalConv3d, TimeTapCausalConv3d)
    encoder = getattr(vae, "encoder", None)
    for module in encoder.modules() if isinstance(encoder, torch.nn.Module) else ():
        if isinstance(module, TimeTapCausalConv3d):
            module.in_order = True
            module.cache_inputs = module.conv.in_channels < module.conv.out_channels
    return count


def _take_axes(x: jax.Array, indices: tuple[np.ndarray, ...]) -> jax.Array:
    for axis, idx in enumerate(indices, start=2):
        if not np.array_equal(idx, np.arange(x.shape[axis])):
            x = jnp.take(x, jnp.asarray(idx, jnp.int32), axis=axis)
    return x


def _resize_like_upstream(t: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Upstream's nearest resize of zq to f's (T, H, W), as one gather per axis.

    Upstream resizes the first frame on its own when f has an odd number of
    frames above one, and concatenates; written as index arrays there is no
    concatenation to materialise (a width-sharded program did, at full size).
    """
    t_in, t_out = t.shape[2], f.shape[2]
    if t_out > 1 and t_out % 2 == 1:
        t_idx = np.concatenate([[0], 1 + nearest_indices(t_in - 1, t_out - 1)])
    else:
        t_idx = nearest_indices(t_in, t_out)
    indices = (t_idx, *(nearest_indices(t.shape[a], f.shape[a]) for a in (3, 4)))
    return interop.torch_view(functools.partial(_take_axes, indices=indices))(t)


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
    """

    def forward(self, f: torch.Tensor, zq: torch.Tensor, conv_cache: dict[str, torch.Tensor] | None = None):
        if not is_torchax(f) or not (_is_pointwise(self.conv_y) and _is_pointwise(self.conv_b)):
            return super().forward(f, zq, conv_cache)
        conv_cache = conv_cache or {}
        new_conv_cache = {}
        # Our conv kernel casts the weights to the input's dtype; torchax's
        # own lowering would not, so without it zq stays as it is.
        fp32 = isinstance(self.conv_y.conv, _FusedBiasConv) and isinstance(self.conv_b.conv, _FusedBiasConv)
        zq_in = zq.float() if fp32 else zq
        y, new_conv_cache["conv_y"] = self.conv_y(zq_in, conv_cache=conv_cache.get("conv_y"))
        b, new_conv_cache["conv_b"] = self.conv_b(zq_in, conv_cache=conv_cache.get("conv_b"))
        normed = self.norm_layer(f)
        new_f = normed.to(y.dtype) * _resize_like_upstream(y, f) + _resize_like_upstream(b, f)
        return new_f.to(f.dtype), new_conv_cache


def apply_low_res_spatial_norm(vae: torch.nn.Module) -> int:
    """Makes every `CogVideoXSpatialNorm3D` in ``vae`` a `LowResSpatialNorm3D`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return _swap_class(vae, CogVideoXSpatialNorm3D, LowResSpatialNorm3D)


def apply_group_norm(vae: torch.nn.Module) -> int:
    """Makes every `nn.GroupNorm` in ``vae`` a `JaxGroupNorm`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return _swap_class(vae, torch.nn.GroupNorm, JaxGroupNorm)


def apply_silu(vae: torch.nn.Module) -> int:
    """Makes every `nn.SiLU` in ``vae`` a `JaxSiLU`.

    Returns:
        How many modules changed in this call (0 on a second call).
    """
    return _swap_class(vae, torch.nn.SiLU, JaxSiLU)


def _nearest_interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """`F.interpolate` for ``mode="nearest"`` by `kernels.upsample.nearest`; other modes go to torchax as before."""
    if mode != "nearest" or antialias or not is_torchax(input):
        raise torchax.tensor.OperatorNotFound("not nearest: torchax's own path")  # torchax falls back
    spatial = input.ndim - 2
    if size is not None:
        out_size = (int(size),) * spatial if isinstance(size, int) else tuple(int(v) for v in size)
        factors = None
    else:
        sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (float(scale_factor),) * spatial
        # As F.interpolate: floor(in * factor), and the factor itself decides
        # the index rounding unless recompute_scale_factor asks otherwise.
        out_size = tuple(int(math.floor(float(n) * f)) for n, f in zip(input.shape[2:], sf, strict=True))
        factors = None if recompute_scale_factor else sf
    fn = functools.partial(nearest, out_size=out_size, scale_factors=factors)
    return interop.torch_view(fn)(input)


_ENVIRONMENTS: dict[bool, Any] = {}


def traced_environment(nearest_upsample: bool) -> Any:
    """The torchax environment our traced calls run in, one per setting.

    ``F.interpolate`` is a function, not a module, so the nearest-upsample
    patch cannot be applied to a module: it is an op override
    (torchax's public ``override_op_definition``) on an environment of our
    own, used only inside our jitted encode and decode, so torchax's
    default environment and anyone else's torch code keep torchax's own
    lowering.
    """
    if nearest_upsample not in _ENVIRONMENTS:
        env = torchax.tensor.Environment()
        if nearest_upsample:
            env.override_op_definition(torch.nn.functional.interpolate, _nearest_interpolate)
        _ENVIRONMENTS[nearest_upsample] = env
    return _ENVIRONMENTS[nearest_upsample]


# Activations are constrained where they are produced: every causal conv (the
# bulk of the compute), every norm, and every upsampler (where width doubles).
_SHARDED_OUTPUTS = (CogVideoXCausalConv3d, torch.nn.GroupNorm, CogVideoXUpsample3D)
class ShardedOutputMixin:
    """Constrains a module's output to `sharding.activation_spec` on its ``activation_mesh``.

    ``activation_mesh`` is set by `apply_width_sharding`; None (or a
    one-device mesh) leaves outputs alone. Of a tuple output (a causal
    conv's ``(activation, conv_cache)``) only the first element is the
    activation.
    """

    activation_mesh: Mesh | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = super().forward(*args, **kwargs)
        mesh = self.activation_mesh
        first = output[0] if isinstance(output, tuple) else output
        if mesh is None or mesh.size == 1 or not is_torchax(first):
            return output
        first = interop.torch_view(functools.partial(sharding.constrain_activation, mesh=mesh))(first)
        return (first, *output[1:]) if isinstance(output, tuple) else first


def apply_width_sharding(vae: torch.nn.Module, mesh: Mesh | None) -> int:
    """Constrains activations to split width over ``tp`` and batch over ``dp``.

    Apply it after the other module patches (they swap exact classes).
    Re-applying replaces the previous mesh; ``None`` or a one-device mesh
    removes the constraints.

    Returns:
        How many modules carry a constraint afterwards.
    """
    active = mesh is not None and mesh.size > 1
    count = 0
    for module in vae.modules():
        if not isinstance(module, _SHARDED_OUTPUTS):
            continue
        if active:
            add_mixin(module, ShardedOutputMixin)
            count += 1
        if isinstance(module, ShardedOutputMixin):
            module.activation_mesh = mesh if active else None
    return count
