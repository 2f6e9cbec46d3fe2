"""The model families the runtime serves, one `Family` record each, and how a module or config is told apart.

A family is detected from the upstream module's class or from a config's
``_class_name``; a config without one by its keys (`of_config`: those saved
before the second family are CogVideoX's). Adding a family is a folder (its record,
presets, config check, frame rules and patches) and one entry in
`FAMILIES`; docs/adding-a-family.md says what it takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cogvideox_torchax.families.base import Family
from cogvideox_torchax.families.checks import ConfigError
from cogvideox_torchax.families.cogvideox import COGVIDEOX
from cogvideox_torchax.families.hunyuan import HUNYUAN
from cogvideox_torchax.families.hunyuan.hunyuan15 import HUNYUAN15
from cogvideox_torchax.families.ltx2 import LTX2
from cogvideox_torchax.families.ltx2.ltx_video import LTX_VIDEO
from cogvideox_torchax.families.wan import WAN

__all__ = ["FAMILIES", "ConfigError", "Family", "UnsupportedModelError", "get", "of_config", "of_module",
           "of_preset", "preset_names"]

FAMILIES: Mapping[str, Family] = MappingProxyType(
    {f.name: f for f in (COGVIDEOX, WAN, LTX2, LTX_VIDEO, HUNYUAN, HUNYUAN15)})

# The family of a config that names no class: every config saved before the
# second family was CogVideoX's.
DEFAULT = COGVIDEOX


class UnsupportedModelError(ValueError):
    """A module or config of a model family the runtime does not serve; the message names those it does."""


def supported() -> str:
    """The upstream classes served, for messages."""
    return " or ".join(f.class_name for f in FAMILIES.values())


def get(name: str) -> Family:
    """The family named ``name`` (``"cogvideox"``, ``"wan"``)."""
    if name not in FAMILIES:
        raise UnsupportedModelError(f"no model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def of_class_name(class_name: str | None) -> Family:
    """The family whose upstream class is ``class_name``; None is the default family's."""
    if class_name is None:
        return DEFAULT
    for family in FAMILIES.values():
        if family.class_name == class_name:
            return family
    raise UnsupportedModelError(f"{class_name!r}, not an {supported()} (the models this runtime runs)")


def of_module(module: Any) -> Family:
    """The family of an upstream module (or a patched one, or a `TorchaxVAE`, which carries its own)."""
    family = getattr(module, "family", None)
    if isinstance(family, Family):
        return family
    for family in FAMILIES.values():
        if family.is_module(module):
            return family
    raise UnsupportedModelError(f"{type(module).__name__!r}, not an {supported()} (the models this runtime runs)")


def _arguments(family: Family) -> set[str]:
    return set(inspect.signature(family.upstream.__init__).parameters) - {"self"}


def of_config(config: Mapping[str, Any]) -> Family:
    """The family a diffusers config describes: its ``_class_name``, or where it has none, its keys.

    Without ``_class_name``, the family whose upstream constructor takes
    every key of the config (those not starting with ``_``); where several
    do, the default family if it is one of them (configs saved before the
    second family named no class), else the one leaving the fewest of its
    arguments out.

    Raises:
        UnsupportedModelError: a class this runtime does not run, or keys
            that no family, or more than one but not the default, takes:
            the message names the keys looked at.
    """
    name = config.get("_class_name") if isinstance(config, Mapping) else None
    if name is not None and not isinstance(name, str):
        raise UnsupportedModelError(f"'_class_name' {name!r}, not an {supported()} (the models this runtime runs)")
    if name is not None or not isinstance(config, Mapping):
        return of_class_name(name)
    keys = sorted(k for k in config if isinstance(k, str) and not k.startswith("_"))
    fits = [f for f in FAMILIES.values() if set(keys) <= _arguments(f)]
    if len(fits) == 1 or DEFAULT in fits:
        return fits[0] if len(fits) == 1 else DEFAULT
    # A class whose arguments are another's and more (LTX-2's are LTX-Video's and its padding and upsampling
    # kinds): the one with the fewest keys left out, as a saved config names every argument of its class.
    missing = sorted((len(_arguments(f) - set(keys)), i) for i, f in enumerate(fits))
    if len(missing) > 1 and missing[0][0] < missing[1][0]:
        return fits[missing[0][1]]
    if fits:
        told = f"{' and '.join(f.class_name for f in fits)} all take them"
    else:
        told = "; ".join(f"{f.class_name} does not take {sorted(set(keys) - _arguments(f))}" for f in FAMILIES.values())
    raise UnsupportedModelError(
        f"config with no '_class_name' whose keys do not tell its model (looked at {keys}: {told}); "
        f"add '_class_name' ({supported()})"
    )


def preset_names() -> dict[str, str]:
    """Every family's preset names, with the family each belongs to."""
    return {preset: f.name for f in FAMILIES.values() for preset in f.presets}


def of_preset(name: str) -> Family:
    """The family a named preset belongs to."""
    found = preset_names()
    if name not in found:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(found))}")
    return FAMILIES[found[name]]
