"""Convolution weights given to a CPU program in the layout its convolutions read, so that no call transposes them.

The CPU's plan convolves channels-last (`kernels.conv.ConvPolicy.channels_last`)
with weights ``(*kernel, I, O)``; upstream's are ``(O, I, *kernel)``. Given
in upstream's layout, every call transposed every weight again: they are
the program's arguments, so nothing hoists it, and for LTX-2's wide decoder
that was a third of the CPU decode and 2 GB of temporaries
(docs/results/ltx2-cpu-weights-2026-12-07.md). A CPU program takes the
convolution weights it reads transposed, once, kept beside upstream's
(`ProgramCache.weights_for`), and turns them back to upstream's layout where
its trace begins: the module sees upstream's shapes, and where a
convolution reads the weight XLA cancels the two transposes (or makes the
pair a bitcast; where a loop reads it, the XLA of jax 0.12 copies it once
per call before the loop, in the order it is held in).

Only the side a program runs is transposed: the encoder's weights (and
``quant_conv``'s) for an encode, every other convolution's for a decode, so
a run that only decodes never copies the encoder's. A weight put on the
wrong side by that rule is still right, only transposed per call again.
ROCm's plan is channels-last too, but a GPU's memory plan counts a
program's arguments, not a copy kept beside them: its programs take
upstream's layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import torch

from cogvideox_torchax.platforms.run_plan import RunPlan

_ENCODE_SIDE = ("encoder.", "quant_conv.")


def _to_program(ndim: int) -> tuple[int, ...]:
    return (*range(2, ndim), 1, 0)  # (O, I, *kernel) -> (*kernel, I, O)


def _to_upstream(ndim: int) -> tuple[int, ...]:
    return (ndim - 1, ndim - 2, *range(ndim - 2))


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """Which weights a program takes transposed to ``(*kernel, I, O)``; every other one as upstream holds it.

    Attributes:
        transposed: the state-dict names of those weights (none for a
            channels-first plan).
    """

    transposed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, module: torch.nn.Module, plan: RunPlan, side: str) -> WeightLayout:
        """The layout of ``plan``'s ``side`` (``"decode"`` or ``"encode"``) programs of ``module``.

        The CPU's (channels-last): the weights of its 2-D and 3-D
        convolutions on that side, but for a convolution whose patch reads
        its weight otherwise (``keeps_upstream_weight_layout``: Wan's time
        taps). Otherwise none.
        """
        if plan.conv is None or not plan.conv.channels_last or plan.placement.is_gpu:
            return cls()
        return cls(frozenset(
            f"{path}.weight" for path, m in module.named_modules()
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) and not m.transposed
            and not getattr(m, "keeps_upstream_weight_layout", False)
            and f"{path}.".startswith(_ENCODE_SIDE) == (side == "encode")
        ))

    def to_program(self, weights: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """``weights`` (upstream's layout) as the program takes them: the transposed ones new arrays, placed alike."""
        moved = {name: w for name, w in weights.items() if name in self.transposed}
        # One program for all of them (one compile), each result placed as its weight was: whole on every
        # device (the weights are replicated), so the same sharding fits the transposed shape.
        moved = jax.jit(lambda ws: {k: a.transpose(_to_program(a.ndim)) for k, a in ws.items()},
                        out_shardings={k: w.sharding for k, w in moved.items()})(moved)
        return {name: moved.get(name, w) for name, w in weights.items()}

    def specs(self, weights: Mapping[str, Any]) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes, dtypes and shardings of the weights as the program takes them, from upstream's (arrays or specs)."""
        return {
            name: jax.ShapeDtypeStruct(
                tuple(w.shape[i] for i in _to_program(len(w.shape))) if name in self.transposed else w.shape,
                w.dtype, sharding=w.sharding)
            for name, w in weights.items()
        }

    def to_upstream(self, weights: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Inside the program: its weights back in upstream's layout, as the module reads them."""
        return {
            name: w.transpose(_to_upstream(w.ndim)) if name in self.transposed else w
            for name, w in weights.items()
        }
