"""Every patch, in the order of application derived from what each declares, and each family's share.

Each module of the shared package (`cogvideox_torchax.patches`: what every
family uses) and of each model family's own ``patch_package``
(`cogvideox_torchax.families.<name>.patches`) that declares ``PATCHES``
is found here, so adding a patch touches its own module (and its test)
only: its switch becomes a keyword of `RuntimeOptions`, its place in the
order follows from its stage, ``requires`` and ``after``, its family from
its ``families``, and its documentation appears in the handbook's list of
switches (`switches_markdown`).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any

from cogvideox_torchax import families
from cogvideox_torchax._torch_compat import import_torchax
from cogvideox_torchax.patches.base import STAGES, Patch

PACKAGE = "cogvideox_torchax.patches"


def ordered(found: Iterable[Patch]) -> tuple[Patch, ...]:
    """``found`` in the order of application: by stage, then after what each requires or follows, then by name.

    Raises:
        RuntimeError: two patches answer to one switch; a patch requires a
            switch no patch has, or one of a later stage; the declared
            order has a cycle.
    """
    by_switch: dict[str, Patch] = {}
    for patch in found:
        if patch.switch in by_switch:
            raise RuntimeError(f"two patches answer to the switch {patch.switch!r}")
        by_switch[patch.switch] = patch
    stage = {name: STAGES.index(p.stage) for name, p in by_switch.items()}
    before: dict[str, set[str]] = {}
    for name, patch in by_switch.items():
        for needed in patch.requires:
            if needed not in by_switch:
                raise RuntimeError(f"patch {name!r} requires {needed!r}, which no patch answers to")
        for needed in (*patch.requires, *patch.after):
            if needed in by_switch and stage[needed] > stage[name]:
                raise RuntimeError(f"patch {name!r} ({patch.stage}) cannot follow {needed!r} of a later stage")
        before[name] = {n for n in (*patch.requires, *patch.after) if n in by_switch and stage[n] == stage[name]}
    order: list[str] = []
    for level in range(len(STAGES)):
        waiting = {n for n in by_switch if stage[n] == level}
        while waiting:
            ready = sorted(n for n in waiting if not before[n] & waiting)
            if not ready:
                raise RuntimeError(f"the declared order of {sorted(waiting)} has a cycle")
            order.append(ready[0])
            waiting.remove(ready[0])
    return tuple(by_switch[n] for n in order)


def _declared(package: str) -> list[Patch]:
    pkg = importlib.import_module(package)
    found: list[Patch] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package}.{info.name}")
        found.extend(getattr(module, "PATCHES", ()))
    return found


def packages() -> tuple[str, ...]:
    """The packages whose modules declare patches: the shared one, then each family's ``patch_package`` (once each).

    Families of one folder (LTX-2 and LTX-Video) share theirs.
    """
    return tuple(dict.fromkeys((PACKAGE, *(family.patch_package for family in families.FAMILIES.values()))))


def discover() -> tuple[Patch, ...]:
    """The ``PATCHES`` of every module of every package of `packages`, in order (`ordered`).

    Raises:
        RuntimeError: a patch names a family that is not registered (or see `ordered`).
    """
    found = [patch for package in packages() for patch in _declared(package)]
    for patch in found:
        unknown = sorted(set(patch.families or ()) - set(families.FAMILIES))
        if unknown:
            raise RuntimeError(f"patch {patch.switch!r} names unknown families {unknown}")
    return ordered(found)


@functools.cache
def patches() -> tuple[Patch, ...]:
    """Every registered `Patch`, of every family, in the order of application."""
    return discover()


def patches_for(family: str) -> tuple[Patch, ...]:
    """The patches of the model family ``family`` (its own and every family's), in the order of application."""
    return tuple(p for p in patches() if p.patches(family))


_ENVIRONMENTS: dict[frozenset[str], Any] = {}


def environment(switches: Iterable[str]) -> Any:
    """The torchax environment our traced calls run in, with the op overrides of those of ``switches`` that have any.

    Functions such as ``F.interpolate`` are not modules, so their patches
    cannot be applied to a module: each is an op override (torchax's
    public ``override_op_definition``) on an environment of our own, one
    per set of overrides, used only inside our jitted encode and decode,
    so torchax's default environment and anyone else's torch code keep
    torchax's own lowering.
    """
    torchax = import_torchax()
    by_switch = {p.switch: p for p in patches() if p.overrides is not None}
    key = frozenset(s for s in switches if s in by_switch)
    if key not in _ENVIRONMENTS:
        env = torchax.tensor.Environment()
        for switch in sorted(key):
            for op, impl in by_switch[switch].overrides().items():
                env.override_op_definition(op, impl)
        _ENVIRONMENTS[key] = env
    return _ENVIRONMENTS[key]


def switches() -> tuple[str, ...]:
    """Every patch's switch, in the order of application."""
    return tuple(p.switch for p in patches())


def switches_markdown(found: Iterable[Patch] | None = None) -> str:
    """The handbook's table of switches: order, switch, stage, requires, what it does."""
    rows = [
        "| # | switch | stage | requires | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, p in enumerate(patches() if found is None else found, 1):
        needs = ", ".join(f"`{n}`" for n in p.requires) or "-"
        which = "" if p.families is None else ", ".join(families.get(f).title for f in p.families) + " only: "
        which += "" if p.opt_in is None else "**off by default where its plan says why.** "
        rows.append(f"| {i} | `{p.switch}` | {p.stage} | {needs} | {which}{p.doc.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
