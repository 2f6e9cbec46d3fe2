"""Every patch of the package, in the order of application.

Each module of `cogvideox_torchax.patches` that declares ``PATCHES`` is
found here, so adding a patch touches its own module (and its test) only.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from cogvideox_torchax.patches.base import Patch


@functools.cache
def patches() -> tuple[Patch, ...]:
    """Every `Patch` of the package, lowest `Patch.order` first.

    Raises:
        RuntimeError: two patches answer to one switch or share an order.
    """
    package = importlib.import_module("cogvideox_torchax.patches")
    found: list[Patch] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found.extend(getattr(module, "PATCHES", ()))
    found.sort(key=lambda p: p.order)
    for what, values in (("switch", [p.option for p in found]), ("order", [p.order for p in found])):
        if len(set(values)) != len(values):
            raise RuntimeError(f"two patches share a {what}: {sorted(values)}")
    return tuple(found)
