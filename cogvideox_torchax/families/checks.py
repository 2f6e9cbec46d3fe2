"""What every family's config check shares: the error it raises and the tests of a value's kind."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

MAX_INT = 2**31 - 1


class ConfigError(ValueError):
    """A config value the architecture cannot use; the message names the key, its value and what it must be."""


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(v: Any) -> bool:
    """A number (not a bool) whose float is finite (ints too large for a float are not)."""
    try:
        return is_number(v) and math.isfinite(float(v))
    except OverflowError:
        return False


def positive_int(v: Any) -> bool:
    return is_int(v) and 1 <= v <= MAX_INT


class Checker:
    """Names a bad key of ``merged`` (the config over upstream's defaults), its value and what it must be."""

    def __init__(self, merged: Mapping[str, Any], source: str):
        self.merged = merged
        self.source = source

    def bad(self, key: str, must: str) -> ConfigError:
        value = repr(self.merged[key])
        value = value if len(value) <= 60 else value[:57] + "..."
        return ConfigError(f"{self.source}: {key!r} is {value}; it must be {must}")

    def require(self, key: str, ok: bool, must: str) -> None:
        if not ok:
            raise self.bad(key, must)


@functools.cache
def upstream_defaults(class_name: str) -> Mapping[str, Any]:
    """The defaults of diffusers' ``class_name`` constructor: what a config may leave out (imports diffusers)."""
    import diffusers

    params = inspect.signature(getattr(diffusers, class_name).__init__).parameters
    return MappingProxyType({k: v.default for k, v in params.items() if k != "self"})


def check_builds(upstream: type, merged: Mapping[str, Any], source: str) -> None:
    """Refuses what upstream's constructor refuses: it is the judge of a config's structure.

    Built on the meta device (shapes only, no memory); its error, whatever
    its type, becomes a `ConfigError` quoting it.
    """
    import torch

    try:
        with torch.device("meta"):
            upstream.from_config({k: v for k, v in merged.items() if not k.startswith("_")})
    except Exception as e:  # noqa: BLE001  (whatever upstream's constructor raises is its refusal)
        raise ConfigError(f"{source}: upstream's {upstream.__name__} does not build from it: "
                          f"{type(e).__name__}: {' '.join(str(e).split())}") from e
