"""The systems `bench.decode` measures, one record each: the runner, the isolation, the report and the page read it.

Ours and the Flax port are JAX programs, compiled ahead of the first call.
The torch rows are upstream's own decode as GPU users would run it: eager
(``torch``, the row of every earlier page), the decoder under
``torch.compile`` (default mode), the convolutions and latents channels-last,
and the two combined. The report names the fastest torch row of each shape
and gives ours against it (`bench.report.fastest_torch`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class System:
    """One measured system.

    Attributes:
        name: ``--systems``' word and the JSON's ``system``.
        column: the results page's column.
        framework: ``"jax"`` (compiled ahead of time: ``--compile-only`` runs it) or ``"torch"`` (upstream's module).
        torch_compile: upstream's decoder under ``torch.compile`` (default mode); its first call is its compile time.
        channels_last: upstream's convolution weights and the latents channels-last (`bench.runners.channels_last`).
    """

    name: str
    column: str
    framework: str
    torch_compile: bool = False
    channels_last: bool = False

    @property
    def compiles(self) -> bool:
        """Whether the row has a compile time (ours and the port: the XLA compile; torch.compile: its first call)."""
        return self.framework == "jax" or self.torch_compile


RECORDS: tuple[System, ...] = (
    System("torchax", "ours", "jax"),
    System("flax", "Flax port", "jax"),
    System("torch", "eager torch", "torch"),
    System("torch-compile", "torch.compile", "torch", torch_compile=True),
    System("torch-cl", "eager torch, channels-last", "torch", channels_last=True),
    System("torch-compile-cl", "torch.compile, channels-last", "torch", torch_compile=True, channels_last=True),
)
BY_NAME: dict[str, System] = {s.name: s for s in RECORDS}
SYSTEMS: tuple[str, ...] = tuple(BY_NAME)
# Upstream's decode as GPU users would run it: the rows the fastest torch row is picked from.
TORCH_ROWS: tuple[str, ...] = tuple(s.name for s in RECORDS if s.framework == "torch")


def system(name: str) -> System:
    """The record of ``name``; a name no record has raises `KeyError` naming the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}") from None
