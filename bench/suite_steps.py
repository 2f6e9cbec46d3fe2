"""The standard accelerator set of `bench.suite`: one table of steps, each one measurement.

A row of `STEPS` is a command of an existing bench module at a model and
latent shape (and the tiny ones of ``--quick``); its ``kind`` says which
command (`bench.suite.COMMANDS`) and how the page reads its JSON
(`bench.suite_page.ROWS`). A new measurement is a new row; a new model
family's rows name their ``family``.
"""

from __future__ import annotations

import dataclasses

# The Flax NNX port (bench/flax_vae.py) is of CogVideoX's decoder only: no
# other family's step runs it, and its column says so on their rows.
from bench.inputs import FLAX_PORT_FAMILIES
from bench.systems import SYSTEMS, TORCH_ROWS

__all__ = ["FLAX_PORT_FAMILIES", "STEPS", "SYSTEMS", "Step", "step_systems"]


@dataclasses.dataclass(frozen=True)
class Step:
    """One standard measurement.

    Attributes:
        name: the step's key in the JSON and the page.
        kind: what command the step is (`bench.suite.COMMANDS`) and how its JSON is read (`bench.suite_page.ROWS`).
        label: the model as the page names it ("2b").
        model: ``--model`` of the full run (``random:PRESET``: real config, seeded weights).
        shape: latent ``T,H,W`` (``B,C,T,H,W`` for ``readme``: the bundled example file's).
        quick_model, quick_shape: the same for ``--quick``.
        family: the model family; the Flax port runs for `FLAX_PORT_FAMILIES` alone.
        systems: the systems the step measures, of `SYSTEMS`.
        repeats: steady-state calls (median); ``--quick`` makes one.
        timeout_s: the step's wall-clock limit (``--timeout`` overrides every step's).
    """

    name: str
    kind: str
    label: str
    model: str
    shape: str
    quick_model: str = "random:tiny"
    quick_shape: str = "2,4,4"
    family: str = "cogvideox"
    systems: tuple[str, ...] = SYSTEMS
    repeats: int = 3
    timeout_s: int = 900


# The H100 page's rows (issue 48), in its order; then Wan's. The four decodes (2b, 1.5, Wan 2.1 at 480p and
# 720p) run every torch row (issue 56: eager, torch.compile, channels-last, both), each in its own process on
# an accelerator; `--only decode-2b,decode-wan2.1-720p,decode-1.5` runs the most wanted first.
STEPS: tuple[Step, ...] = (
    Step("decode-2b", "decode", "2b", "random:cogvideox-2b", "13,60,90"),
    Step("decode-1.5", "decode", "1.5", "random:cogvideox-1.5", "21,96,170", quick_shape="3,4,6", repeats=2,
         timeout_s=1500),
    Step("parity-2b", "parity", "2b", "random:cogvideox-2b", "3,16,16", systems=("torchax", "flax", "torch"), repeats=1,
         timeout_s=600),
    Step("cold-warm-2b", "cold-warm", "2b", "random:cogvideox-2b", "13,60,90", systems=("torchax",), repeats=1),
    # Where a steady 2b decode's time goes, op by op (issue 48: the share of the peak not used).
    Step("profile-2b", "profile", "2b", "random:cogvideox-2b", "13,60,90", systems=("torchax", "torch"), repeats=1,
         timeout_s=600),
    Step("stream-2b", "stream", "2b", "random:cogvideox-2b", "13,60,90", systems=("torchax", "torch"), repeats=1,
         timeout_s=600),
    Step("readme", "readme", "2b", "random:cogvideox-2b", "1,16,3,8,8", quick_shape="1,4,2,4,4",
         systems=("torchax",), timeout_s=300),
    # Wan 2.1 (issue 46): 81 frames at 480x832, ours against the torch rows, each in its own process.
    Step("decode-wan2.1", "decode", "Wan 2.1", "random:wan2.1", "21,60,104", quick_model="random:wan-tiny",
         family="wan", systems=("torchax", *TORCH_ROWS), timeout_s=1500),
    # 720p x 81: issue 46's memory goal (8 GiB on one H100/H200) measured on the device.
    Step("decode-wan2.1-720p", "decode", "Wan 2.1", "random:wan2.1", "21,90,160", quick_model="random:wan-tiny",
         family="wan", systems=("torchax", *TORCH_ROWS), repeats=2, timeout_s=1500),
    Step("parity-wan2.1", "parity", "Wan 2.1", "random:wan2.1", "3,16,16", quick_model="random:wan-tiny",
         family="wan", systems=("torchax", "torch"), repeats=1, timeout_s=600),
)  # fmt: skip


def step_systems(step: Step, chosen: tuple[str, ...]) -> tuple[str, ...]:
    """The systems ``step`` runs: its own, of those chosen, the Flax port only for its families."""
    return tuple(s for s in step.systems if s in chosen and (s != "flax" or step.family in FLAX_PORT_FAMILIES))
