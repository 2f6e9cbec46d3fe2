"""Which way a batch shape decodes: streamed, or whole on the memory plan. The rule every decode run shares.

mp4 and PNG outputs stream (`TorchaxVAE.decode_stream`, written while the
next latent frames decode) when the plan can (`vae.stream.why_not_streamed`)
and the stream's programs fit the budget; otherwise each video decodes whole
on the planner's plan (`TorchaxVAE.memory_plan`: whole, tiled, or on a wider
mesh). A streamed decode holds one latent frame batch's activations rather
than the whole video's, so it fits wherever the whole decode does and often
where only a tiled one would. A stream that runs out of memory under
``--max-memory auto`` falls back to the plan (`ShapePlan.fall_back`), once.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cogvideox_torchax.cli import errors, out_of_memory

if TYPE_CHECKING:
    from cogvideox_torchax.memory.budget import MemoryPlan

STREAMED_KINDS = ("mp4", "png")


@dataclasses.dataclass
class ShapePlan:
    """One batch shape's way: the stream's plan (None: decoded whole) and why it does not stream."""

    shape: tuple[int, ...]
    program: str  # the whole decode's program: "frames" (uint8 frames made on device) or "decode"
    streamed: MemoryPlan | None
    why_not: str | None
    compiled: Any = None  # what the compile stage returned for the stream's programs

    def memory_plan(self, vae) -> MemoryPlan | None:
        """The plan the shape ran (or would run) on."""
        return self.streamed or vae.planned(self.shape, kind=self.program)

    def fall_back(self, why: str) -> None:
        """Decodes whole on the memory plan from now on."""
        self.streamed, self.why_not = None, why


def why_not(stream: bool, kind: str | None, vae, shape: tuple[int, ...], target: str | None = None) -> str | None:
    """Why latents of ``shape`` written as ``kind`` do not stream (before compiling anything), or None."""
    if kind is None:
        return "no output named"
    if not stream:
        return "--no-stream"
    if kind not in STREAMED_KINDS:
        return f"a .{kind} output holds one array, written once the whole video is decoded"
    if target is not None:
        return "--target plans the whole decode: the stream's programs compile for the devices that are here"
    from cogvideox_torchax.vae import stream  # imports JAX: not before the options are checked

    return stream.why_not_streamed(vae.module, tuple(shape), vae.programs)


def choose(vae, shape: tuple[int, ...], kind: str | None, stream: bool, target: str | None = None,
           compile_with: Callable[[Callable[[Any], Any]], Any] | None = None) -> ShapePlan:
    """Streamed if it can and its two programs fit the budget (compiled through ``compile_with(fn)``), else whole.

    A stream whose compile runs out of memory decodes whole on the plan,
    which is checked against the budget by its own compiled bytes.
    """
    # A --target report reads the whole decode's compiled bytes and HLO (as the bench does).
    program = "frames" if kind in STREAMED_KINDS and target is None else "decode"
    why = why_not(stream, kind, vae, shape, target)
    if why is not None:
        return ShapePlan(tuple(shape), program, None, why)
    plans: list[MemoryPlan] = []

    def compile_stream(s: Any) -> None:
        plans.append(vae.stream_plan(tuple(s)))

    try:
        compiled = compile_with(compile_stream) if compile_with else compile_stream(shape)
    except Exception as e:
        if not out_of_memory.is_out_of_memory(e):
            raise
        return ShapePlan(tuple(shape), program, None, "compiling the streamed decode ran out of memory")
    plan = plans[0]
    if plan.budget is not None and plan.bytes > plan.budget:
        return ShapePlan(tuple(shape), program, None, f"the streamed decode needs {plan.bytes / 2**30:.2f} GiB per "
                         f"device, above the {plan.budget / 2**30:.2f} GiB usable")
    return ShapePlan(tuple(shape), program, plan, None, compiled)


class streaming(contextlib.AbstractContextManager):  # noqa: N801 (a context manager, used as a function)
    """Around a streamed decode: out of memory under ``auto`` falls back to the plan (said); under a budget, exit 3.

    The block is then left without the error; ``plan.streamed`` is None.
    """

    def __init__(self, vae, plan: ShapePlan, say: Callable[[str], None]):
        self.vae, self.plan, self.say = vae, plan, say

    def __exit__(self, exc_type, e, tb) -> bool:
        if e is None or not isinstance(e, Exception) or not out_of_memory.is_out_of_memory(e):
            return False
        if isinstance(e, errors.OutOfMemory):
            return False
        if self.vae.memory_budget()[1] == "max_memory":  # the budget the user gave: out of memory is final
            raise errors.OutOfMemory(out_of_memory.line(e, "decoding latents of", self.plan.shape)) from e
        # As the library's retry does: once more, on the planner's plan.
        self.plan.fall_back("the streamed decode ran out of memory")
        self.say(f"out of memory while streaming latents of shape {self.plan.shape}; "
                 "decoding with the memory plan instead")
        return True
