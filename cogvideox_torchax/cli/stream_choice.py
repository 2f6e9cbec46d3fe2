"""Whether the decode command streams a shape: the rule its one-file, many-latents and dry runs share.

mp4 and PNG outputs stream (`TorchaxVAE.decode_stream`, written while the
next batch decodes) when the plan can (`vae.stream.why_not_streamed`) and
the streamed programs fit the memory budget; otherwise the run decodes
each video whole on the planner's plan (`TorchaxVAE.memory_plan`: whole,
tiled, or on a wider mesh). A streamed decode holds one latent frame
batch's activations rather than the whole video's, so it fits wherever the
whole decode does and often where only a tiled one would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from cogvideox_torchax.cli import errors, out_of_memory

STREAMED_KINDS = ("mp4", "png")


def why_not(stream: bool, kind: str, vae, shape: tuple[int, ...], target: str | None = None) -> str | None:
    """Why latents of ``shape`` written as ``kind`` do not stream (before compiling anything), or None."""
    from cogvideox_torchax.vae import stream as vae_stream

    if not stream:
        return "--no-stream"
    if kind not in STREAMED_KINDS:
        return f"a .{kind} output holds one array, written once the whole video is decoded"
    if target is not None:
        return "--target plans the whole decode: the stream's programs compile for the devices that are here"
    return vae_stream.why_not_streamed(vae.module, tuple(shape), vae.programs)


def streamed_plan(vae, shape: tuple[int, ...], compile_with: Callable[[Callable[[Any], Any]], Any] | None = None):
    """The streamed decode's plan for ``shape`` if it fits, else None; and why not.

    Compiles the stream's two programs (through ``compile_with(fn)``, e.g.
    the command's compile stage, which calls ``fn(shape)`` and returns what
    the caller keeps). Returns ``(plan, compiled, None)`` or
    ``(None, None, why)``.

    Raises:
        errors.OutOfMemory: compiling ran out of memory under a given
            ``--max-memory`` (under ``"auto"`` the run takes the planner's
            plan instead).
    """
    plans: list[Any] = []

    def compile_stream(s: Any) -> None:
        plans.append(vae.stream_plan(tuple(s)))

    try:
        with unless_auto(vae, "compiling the streamed decode of", shape):
            compiled = compile_with(compile_stream) if compile_with else compile_stream(shape)
    except Exception as e:
        if isinstance(e, errors.OutOfMemory) or not out_of_memory.is_out_of_memory(e):
            raise
        return None, None, "compiling the streamed decode ran out of memory"
    plan = plans[0]
    if plan.budget is not None and plan.bytes > plan.budget:
        return None, None, (f"the streamed decode needs {plan.bytes / 2**30:.2f} GiB per device, above the "
                            f"{plan.budget / 2**30:.2f} GiB usable")
    return plan, compiled, None


def unless_auto(vae, what: str, shape: tuple[int, ...]):
    """Exit 3 for out of memory under a given ``--max-memory``; under "auto" the caller falls back to the plan."""
    if vae.memory_budget()[1] == "max_memory":
        return out_of_memory.out_of_memory_as_exit_3(what, tuple(shape))
    return contextlib.nullcontext()
