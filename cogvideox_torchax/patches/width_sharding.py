"""Activations constrained to split width over ``tp`` and batch over ``dp`` (`ShardedOutputMixin`)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from jax.sharding import Mesh

from cogvideox_torchax import families
from cogvideox_torchax.parallel import sharding
from cogvideox_torchax.patches.base import Patch, add_mixin, interop, is_torchax


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

    Activations are constrained where they are produced, by the modules of
    its family's `families.Family.sharded_outputs` (causal convs, norms,
    upsamplers). Apply it after the other module patches (they swap exact
    classes). Re-applying replaces the previous mesh; ``None`` or a
    one-device mesh removes the constraints.

    Returns:
        How many modules carry a constraint afterwards.
    """
    active = mesh is not None and mesh.size > 1
    outputs = families.of_module(vae).sharded_outputs()
    count = 0
    for module in vae.modules():
        if not isinstance(module, outputs):
            continue
        if active:
            add_mixin(module, ShardedOutputMixin)
            count += 1
        if isinstance(module, ShardedOutputMixin):
            module.activation_mesh = mesh if active else None
    return count


def _sharding_why_not(placement, applied: frozenset[str]) -> str | None:
    return "a one-device mesh has nothing to shard" if placement.dp * placement.tp == 1 else None


PATCHES = (
    Patch(
        "shard_activations", "sharding",
        "Constrain activations to split width over ``tp`` and batch over ``dp``; meshes of more than one device.",
        lambda m, plan, mesh: apply_width_sharding(m, mesh),
        why_not=_sharding_why_not,
    ),
)
