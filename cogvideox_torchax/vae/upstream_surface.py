"""Upstream's signatures on `TorchaxVAE`'s methods: each family's own, as ``help`` and ``inspect`` show them.

`TorchaxVAE` keeps upstream's calling conventions in its own class body
(``forward``, the tiling and slicing switches, ``to``, ``eval``/``train``);
its ``decode``, ``encode``, ``forward`` and ``enable_tiling`` take their
family's arguments, which `family_signature` shows instead of
``*args, **kwargs``.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from cogvideox_torchax import families

__all__ = ["family_signature"]


class family_signature:  # noqa: N801 (used as a decorator)
    """A method that shows its family's upstream signature (the default family's on the class).

    ``enable_tiling``'s, ``decode``'s and ``encode``'s arguments differ by
    family (CogVideoX's overlap factors, Wan's strides, LTX-2's timestep and
    causal switch); ``inspect.signature`` and ``help`` show a TorchaxVAE's
    own upstream's, and the class shows CogVideoX's.
    """

    def __init__(self, method: Any) -> None:
        self.method = method
        functools.update_wrapper(self, method)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        family = families.DEFAULT if obj is None else obj.family
        method = self.method

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        call.__signature__ = inspect.signature(getattr(family.upstream, method.__name__))  # type: ignore[attr-defined]
        return call if obj is None else types.MethodType(call, obj)
