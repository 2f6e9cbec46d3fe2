"""Lets torchax 0.0.13 import on torch releases without named-tensor overloads.

torchax builds two tables at import time (`torchax.amp`'s autocast policy and
`torchax.decompositions`' decomposition list) that name ATen overloads taking a
`Dimname` argument, such as ``torch.ops.aten.prod.dim_Dimname``. torch 2.13
removed those overloads, so the attribute lookup raises and ``import torchax``
fails before any of our code runs.

The overloads can never be dispatched on such a torch (nothing produces them),
so the tables only need *something* hashable under those names. We install a
unique placeholder on the op packet for each missing overload, and only for
missing ones: on a torch that still has them (e.g. 2.11) nothing is touched.
This is the only place in the project that knows about the problem.
"""

from __future__ import annotations

import importlib
import types

import torch

# (packet name, overload name) pairs that torchax 0.0.13 references by
# attribute at import time and that torch 2.13 no longer defines: every
# named-tensor variant (`Dimname`, `dimname`, `names`) in its tables.
# tests/test_torch_compat.py rescans torchax's source for any others.
TORCHAX_DIMNAME_OVERLOADS: tuple[tuple[str, str], ...] = (
    ("all", "dimname"),
    ("all", "dimname_out"),
    ("index_add", "dimname"),
    ("index_copy", "dimname"),
    ("index_copy_", "dimname"),
    ("index_fill", "Dimname_Scalar"),
    ("index_fill", "Dimname_Tensor"),
    ("index_fill_", "Dimname_Scalar"),
    ("index_fill_", "Dimname_Tensor"),
    ("norm", "names_ScalarOpt_dim"),
    ("norm", "names_ScalarOpt_dim_dtype"),
    ("norm", "names_dtype_out"),
    ("norm", "names_out"),
    ("prod", "dim_Dimname"),
    ("std", "correction_names"),
    ("std", "correction_names_out"),
    ("std", "names_dim"),
    ("std", "names_out"),
    ("std_mean", "correction_names"),
    ("std_mean", "names_dim"),
    ("unbind", "Dimname"),
)


class RemovedOverload:
    """Stands in for an ATen overload that this torch build does not define.

    Hashable and distinct from every real op, so a table keyed by it can never
    match a dispatched call; `torch._decomp.get_decompositions` skips it because
    it is not an `OpOverload`.
    """

    __slots__ = ("qualified_name",)

    def __init__(self, qualified_name: str):
        self.qualified_name = qualified_name

    def __repr__(self) -> str:
        return f"RemovedOverload({self.qualified_name!r})"


def _has_overload(packet: torch._ops.OpOverloadPacket, name: str) -> bool:
    # `overloads()` asks the dispatcher, so it is not fooled by an attribute we
    # set ourselves earlier.
    return name in packet.overloads()


def install_missing_overload_placeholders(
    pairs: tuple[tuple[str, str], ...] = TORCHAX_DIMNAME_OVERLOADS,
) -> list[str]:
    """Puts a `RemovedOverload` on each ATen packet lacking the named overload.

    Idempotent; a no-op where torch still defines the overloads.

    Args:
        pairs: ``(packet, overload)`` names under ``torch.ops.aten``.

    Returns:
        The qualified names (``"aten::prod.dim_Dimname"``) that got a placeholder
        in this call or an earlier one.
    """
    installed = []
    for packet_name, overload in pairs:
        packet = getattr(torch.ops.aten, packet_name)
        if _has_overload(packet, overload):
            continue
        existing = packet.__dict__.get(overload)
        if not isinstance(existing, RemovedOverload):
            # OpOverloadPacket.__getattr__ only runs when normal lookup fails,
            # so an instance attribute is enough to satisfy `packet.overload`.
            setattr(packet, overload, RemovedOverload(f"aten::{packet_name}.{overload}"))
        installed.append(f"aten::{packet_name}.{overload}")
    return installed


def import_torchax() -> types.ModuleType:
    """Imports torchax after making the installed torch acceptable to it.

    Every module of this project imports torchax through this function.

    Returns:
        The `torchax` module.
    """
    install_missing_overload_placeholders()
    return importlib.import_module("torchax")
