"""How the upstream VAE is run: `RuntimeOptions`, whose switches are the registered patches'.

Every patch module declares its switch (`cogvideox_torchax.patches.base.Patch`);
`RuntimeOptions` takes each as a keyword and nothing else, so a new patch is
switched with no edit here and a misspelt switch stays an error. The list of
switches, in the order they apply, is generated into the handbook
(docs/switches.md) from the same records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from cogvideox_torchax.config import _JAX_DTYPES, _TORCH_DTYPES, canonical_dtype
from cogvideox_torchax.patches import registry

Switches = tuple[tuple[str, bool], ...]


@dataclasses.dataclass(frozen=True, init=False)
class RuntimeOptions:
    """How the upstream VAE is run; validated on construction, hashable.

    ``RuntimeOptions(dtype="bfloat16", group_norm=False)``: besides
    ``dtype`` and ``conv_split_elements``, every keyword is the switch of a
    registered patch (the handbook's list of switches, in the order they
    apply). A switch is ``None`` (the default: on wherever the platform's
    plan says it applies), ``True`` (on; building a VAE where it cannot
    apply raises ValueError saying why) or ``False`` (off, for comparison).
    Each reads as an attribute (``options.frame_scan``); ``vae.plan`` lists
    what runs.

    Attributes:
        dtype: compute and weight dtype, ``"float32"``, ``"bfloat16"`` or
            ``"float16"`` (fp16 overflows above 65504; the commands refuse
            latents out of range and a result holding NaN/Inf, exit 2).
        conv_split_elements: split any convolution whose input or output
            would hold more elements than this (`kernels.conv.ConvPolicy`);
            None takes the platform's limit (below 2^31 on GPUs, below 2^31
            per device on TPUs, none on the CPU). Needs ``conv_bias``.
        switched: the switches set to True or False, as sorted
            ``(name, value)`` pairs (None, auto, is left out).
    """

    dtype: str
    conv_split_elements: int | None
    switched: Switches

    def __init__(
        self,
        dtype: str | torch.dtype = "float32",
        *,
        conv_split_elements: int | None = None,
        switched: Switches | Mapping[str, bool | None] = (),
        patches: Switches | Mapping[str, bool | None] = (),
        **switches: bool | None,
    ):
        """Takes ``dtype``, ``conv_split_elements`` and any registered switch by name.

        ``patches=`` (a mapping or pairs of switch names) is the spelling of
        earlier versions for switches given by name; it means the same.

        Raises:
            TypeError: a keyword that is no registered switch, or a switch
                that is not None, True or False.
            ValueError: a bad dtype or split size; a switch set True that
                requires one set False.
        """
        known = registry.switches()
        unknown = sorted(set(switches) - set(known))
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise TypeError(f"RuntimeOptions got unknown switches {names}; known: {', '.join(sorted(known))}")
        named = _pairs(switched, "switched") + _pairs(patches, "patches")
        for name, _ in named:
            if name not in known:
                raise ValueError(f"no registered patch answers to {name!r}; known: {', '.join(sorted(known))}")
        values: dict[str, bool | None] = {}
        for name, value in (*named, *switches.items()):
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be None, True or False, got {value!r}")
            if name in values and values[name] is not None and value is not None and values[name] != value:
                raise ValueError(f"{name} is given twice, as {values[name]} and {value}")
            values[name] = value if value is not None else values.get(name)
        object.__setattr__(self, "dtype", canonical_dtype(dtype))
        object.__setattr__(self, "conv_split_elements", conv_split_elements)
        object.__setattr__(self, "switched", tuple(sorted((k, v) for k, v in values.items() if v is not None)))
        self._check()

    def _check(self) -> None:
        split = self.conv_split_elements
        if split is not None and (isinstance(split, bool) or not isinstance(split, int) or split < 1):
            raise ValueError(f"conv_split_elements must be a positive int or None, got {split!r}")
        for patch in registry.patches():
            if self.switch(patch.switch):
                for needs in patch.requires:
                    if self.switch(needs) is False:
                        raise ValueError(f"{patch.switch}=True needs {needs} (not False)")
        if split is not None and self.switch("conv_bias") is False:
            raise ValueError("conv_split_elements needs conv_bias (its kernel does the splitting)")

    def __getattr__(self, name: str) -> bool | None:
        # Only reached for names that are no field: the registered switches.
        if name.startswith("_") or name not in registry.switches():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return dict(self.switched).get(name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *registry.switches()})

    @staticmethod
    def switches() -> tuple[str, ...]:
        """Every registered switch, in the order of application."""
        return registry.switches()

    def switch(self, name: str) -> bool | None:
        """How the switch ``name`` is set; None is auto (and the answer for a name no patch has)."""
        return dict(self.switched).get(name)

    @property
    def patches(self) -> Switches:
        """`switched`, under the name earlier versions gave it."""
        return self.switched

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.dtype]

    @property
    def jax_dtype(self) -> Any:
        return _JAX_DTYPES[self.dtype]


def _pairs(given: Any, what: str) -> list[tuple[str, Any]]:
    pairs = given.items() if isinstance(given, Mapping) else given
    try:
        return list(dict(pairs).items())
    except (TypeError, ValueError):
        raise TypeError(f"{what} must map switch names to True, False or None, got {given!r}") from None
