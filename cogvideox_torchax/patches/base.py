"""What every patch shares: the `Patch` record the plan reads, and the ways a patch changes a module.

A patch module declares ``PATCHES``, a tuple of `Patch`: the switch it
answers to (a keyword of `RuntimeOptions`) and its documentation, the stage
it belongs to and what it must follow, why it does not apply to a
placement, how it patches a module, and any compiler options its program
needs. `cogvideox_torchax.patches.registry` collects them and derives the
order; `cogvideox_torchax.platforms.build` reads nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import torch

from cogvideox_torchax._torch_compat import import_torchax

torchax = import_torchax()
from torchax import interop  # noqa: E402  (torchax must come through the shim)

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from cogvideox_torchax.platforms.run_plan import Placement, RunPlan

# The stages of application, in order: each names how its patches change a
# module. Within a stage the order follows ``requires`` and ``after``, then
# the switches' names. Class swaps match exact classes, so every swap
# (ops, layers, blocks) comes before the mixins (loops, sharding).
STAGES = (
    "ops",  # leaf operations: norms, activations, convolutions, resizes
    "layers",  # causal convolutions, resamplers, spatial norms
    "blocks",  # resnet blocks
    "loops",  # mixins on the encoder, decoder and VAE: frame batches, tiles
    "sharding",  # mixins placing sharding constraints on outputs
)

# Why a patch does not apply to a placement, given the switches applied
# before it (None: it applies).
WhyNot = Callable[["Placement", frozenset[str]], "str | None"]


def _always(placement: Placement, applied: frozenset[str]) -> str | None:
    return None


def _no_options(placement: Placement) -> dict[str, str] | None:
    return None


def keep_barriers(placement: Placement) -> dict[str, str] | None:
    """`Patch.compiler_options` of a patch whose optimization barriers must hold: the platform's `keep_barriers`."""
    return dict(placement.profile.keep_barriers) or None


@dataclasses.dataclass(frozen=True)
class Patch:
    """One optimisation: a `RuntimeOptions` switch and what it does.

    Attributes:
        switch: the switch's name, a keyword of `RuntimeOptions` (on, off,
            or auto: where it applies).
        stage: one of `STAGES`.
        doc: what the switch does, for the options' documentation (the
            handbook's switches page is generated from it).
        apply: patches a module in place for a plan over a mesh; None for a
            patch that acts while tracing (`traced_environment`).
        requires: switches that must be applied before it (it does not
            apply without them; setting it True with one of them False is
            an error).
        after: switches that, where applied, come before it.
        why_not: why it does not apply to a placement, beyond ``platforms``
            and ``requires``; None when it applies.
        compiler_options: XLA options the placement's program needs with it.
        families: the model families it patches (`cogvideox_torchax.families`),
            None for every family (a leaf operation any module may hold).
        overrides: for a patch that acts while tracing, the torch functions
            it replaces on our traced torchax environment and their
            replacements (`registry.environment`).
        opt_in: for a switch the default leaves off on some placements, why
            it does there (None: on by default); set True, it applies there.
        platforms: the platforms (`cogvideox_torchax.platforms.profiles`
            names) it applies on; None for every platform.
        platforms_why: why it does not apply on the others (what it was
            measured on).
    """

    switch: str
    stage: str
    doc: str
    apply: Callable[[torch.nn.Module, RunPlan, Mesh], Any] | None
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    why_not: WhyNot = _always
    compiler_options: Callable[[Placement], dict[str, str] | None] = _no_options
    families: tuple[str, ...] | None = None
    overrides: Callable[[], Mapping[Any, Callable[..., Any]]] | None = None
    opt_in: Callable[[Placement], str | None] | None = None
    platforms: tuple[str, ...] | None = None
    platforms_why: str = ""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"patch {self.switch!r}: stage must be one of {STAGES}, got {self.stage!r}")
        if not self.switch.isidentifier():
            raise ValueError(f"patch switch {self.switch!r} is not a Python identifier (it is a keyword argument)")
        if self.families is not None and (isinstance(self.families, str) or not self.families):
            raise ValueError(f"patch {self.switch!r}: families must be None or a non-empty tuple of family names")
        if self.platforms is not None:
            from cogvideox_torchax.platforms.profiles import PLATFORMS

            if isinstance(self.platforms, str) or not set(self.platforms) <= set(PLATFORMS) or not self.platforms_why:
                raise ValueError(f"patch {self.switch!r}: platforms must be a tuple of {PLATFORMS}, with platforms_why")

    def patches(self, family: str) -> bool:
        """Whether this patch applies to modules of the model family ``family``."""
        return self.families is None or family in self.families


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


def mixed(mixin: type, base: type) -> type:
    """The class `add_mixin` gives a module of class ``base``: ``mixin`` in front of it, one class per pair.

    A family's patch that swaps its own classes maps the mixed class too
    (``mixed(FusedBiasConv, Upstream)`` to ``mixed(FusedBiasConv, Ours)``),
    so it composes with a shared patch's mixin in either order.
    """
    if (mixin, base) not in _COMPOSED:
        name = mixin.__name__.removesuffix("Mixin") + base.__name__
        _COMPOSED[mixin, base] = type(name, (mixin, base), {"__doc__": f"`{base.__name__}` with `{mixin.__name__}`."})
    return _COMPOSED[mixin, base]


def add_mixin(module: torch.nn.Module, mixin: type) -> int:
    """Puts ``mixin`` in front of ``module``'s class, keeping whatever patches that class has.

    Each mixin overrides its own methods and calls ``super()``, so any number
    compose in any order.

    Returns:
        1 if ``module``'s class changed, 0 if it already had ``mixin``.
    """
    if isinstance(module, mixin):
        return 0
    module.__class__ = mixed(mixin, type(module))
    return 1
