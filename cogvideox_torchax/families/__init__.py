"""The model families the runtime serves, one `Family` record each, and how a module or config is told apart.

A family is detected from the upstream module's class or from a config's
``_class_name`` (a config without one is CogVideoX's, as configs saved
before the second family were). Adding a family is a folder (its record,
presets, config check, frame rules and patches) and one entry in
`FAMILIES`; docs/adding-a-family.md says what it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cogvideox_torchax.families.base import Family
from cogvideox_torchax.families.checks import ConfigError
from cogvideox_torchax.families.cogvideox import COGVIDEOX
from cogvideox_torchax.families.ltx2 import LTX2
from cogvideox_torchax.families.wan import WAN

__all__ = ["FAMILIES", "ConfigError", "Family", "UnsupportedModelError", "get", "of_config", "of_module",
           "of_preset", "preset_names"]

FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in (COGVIDEOX, WAN, LTX2)})

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


def of_config(config: Mapping[str, Any]) -> Family:
    """The family a diffusers config describes (its ``_class_name``; none: the default family)."""
    name = config.get("_class_name") if isinstance(config, Mapping) else None
    if name is not None and not isinstance(name, str):
        raise UnsupportedModelError(f"'_class_name' {name!r}, not an {supported()} (the models this runtime runs)")
    return of_class_name(name)


def preset_names() -> dict[str, str]:
    """Every family's preset names, with the family each belongs to."""
    return {preset: f.name for f in FAMILIES.values() for preset in f.presets}


def of_preset(name: str) -> Family:
    """The family a named preset belongs to."""
    found = preset_names()
    if name not in found:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(found))}")
    return FAMILIES[found[name]]
