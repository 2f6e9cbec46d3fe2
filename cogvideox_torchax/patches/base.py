"""What every patch shares: the `Patch` record the plan reads, and the ways a patch changes a module.

A patch module declares ``PATCHES``, a tuple of `Patch`: the
`RuntimeOptions` switch it answers to, where it comes in the order of
application, why it does not apply to a target, how it patches a module,
and any compiler options its program needs. `cogvideox_torchax.patches.registry`
collects them; `cogvideox_torchax.platforms.run_plan` reads nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import torch

from cogvideox_torchax._torch_compat import import_torchax

torchax = import_torchax()
from torchax import interop  # noqa: E402  (torchax must come through the shim)

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from cogvideox_torchax.platforms.run_plan import RunPlan, Target

# Why a patch does not apply to a target, given the switches applied before
# it (None: it applies).
WhyNot = Callable[["Target", frozenset[str]], "str | None"]


def _always(target: Target, applied: frozenset[str]) -> str | None:
    return None


def _no_options(target: Target) -> dict[str, str] | None:
    return None


@dataclasses.dataclass(frozen=True)
class Patch:
    """One optimisation: a `RuntimeOptions` switch and what it does.

    Attributes:
        option: the switch's name (on, off, or auto: where ``why_not``
            says nothing): a `RuntimeOptions` field, or for a patch without
            one, a key of ``RuntimeOptions.patches``.
        order: place in the order of application (lower first).
        apply: patches a module in place for a plan over a mesh; None for a
            patch that acts while tracing (`traced_environment`).
        why_not: why it does not apply to a target, or None.
        compiler_options: XLA options the target's program needs with it.
    """

    option: str
    order: int
    apply: Callable[[torch.nn.Module, RunPlan, Mesh], Any] | None
    why_not: WhyNot = _always
    compiler_options: Callable[[Target], dict[str, str] | None] = _no_options


def requires(*names: str) -> WhyNot:
    """A `Patch.why_not` for a patch that needs the switches ``names`` applied before it."""

    def why_not(target: Target, applied: frozenset[str]) -> str | None:
        missing = [n for n in names if n not in applied]
        return f"needs {', '.join(missing)}" if missing else None

    return why_not


def is_torchax(x: Any) -> bool:
    """Whether ``x`` is a torchax tensor, i.e. we are inside our traced call (patches act only then)."""
    return isinstance(x, (torchax.tensor.Tensor, torchax.view.View))


# An optimization barrier on torch views of JAX values: orders what XLA may schedule freely.
barrier = interop.torch_view(jax.lax.optimization_barrier)


def swap_classes(
    vae: torch.nn.Module, swaps: dict[type, type], where: Callable[[torch.nn.Module], bool] | None = None
) -> int:
    """Gives every submodule whose exact class is a key of ``swaps`` the class it maps to.

    Returns:
        How many modules changed class (0 when already swapped).
    """
    count = 0
    for module in vae.modules():
        patched = swaps.get(type(module))
        if patched is not None and (where is None or where(module)):
            module.__class__ = patched
            count += 1
    return count


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
