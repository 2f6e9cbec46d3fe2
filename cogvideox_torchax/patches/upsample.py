"""``F.interpolate(mode="nearest")`` by `kernels.upsample.nearest`: an op override on our own torchax environment."""

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


# Not a module patch: the traced call scopes it (`traced_environment`).
PATCHES = (
    Patch(
        "nearest_upsample", "ops",
        '``F.interpolate(mode="nearest")`` by `kernels.upsample.nearest`, in the activation dtype (torchax\'s '
        "fallback gathers from an fp32 copy). Acts while tracing.",
        None,
    ),
)
