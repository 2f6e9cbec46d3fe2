"""``F.interpolate(mode="nearest"|"nearest-exact")`` by `kernels.upsample.nearest`: an op override while tracing."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from cogvideox_torchax.kernels.upsample import nearest
from cogvideox_torchax.patches.base import Patch, interop, is_torchax, torchax


def _nearest_interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """`F.interpolate`'s ``"nearest"`` and ``"nearest-exact"`` by `kernels.upsample.nearest`; others to torchax."""
    if mode not in ("nearest", "nearest-exact") or antialias or not is_torchax(input):
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
    fn = functools.partial(nearest, out_size=out_size, scale_factors=factors, exact=mode == "nearest-exact")
    return interop.torch_view(fn)(input)


def traced_environment(nearest_upsample: bool) -> Any:
    """The environment of our traced calls with (or without) the nearest-upsample override (`registry.environment`)."""
    from cogvideox_torchax.patches import registry

    return registry.environment(("nearest_upsample",) if nearest_upsample else ())


# Not a module patch: the traced call scopes it (`registry.environment`).
PATCHES = (
    Patch(
        "nearest_upsample", "ops",
        '``F.interpolate(mode="nearest")`` (and ``"nearest-exact"``) by `kernels.upsample.nearest`, in the '
        "activation dtype (torchax's fallback gathers from an fp32 copy). Acts while tracing.",
        None,
        overrides=lambda: {torch.nn.functional.interpolate: _nearest_interpolate},
    ),
)
