"""Each batch shape's way, decided and compiled before the first decode: streamed, or whole on the memory plan.

mp4 and PNG outputs stream (`TorchaxVAE.decode_stream`, written while the
next latent frames decode) when the plan can (`vae.stream.why_not_streamed`)
and the stream's programs fit the budget; otherwise each video decodes whole
on the planner's plan (`TorchaxVAE.memory_plan`: whole, tiled, or on a wider
mesh). A streamed decode holds one latent frame batch's activations rather
than the whole video's, so it fits wherever the whole decode does and often
where only a tiled one would. A stream that runs out of memory under
``--max-memory auto`` falls back to the plan (`streaming`), once. The
compile and plan stages both commands show are here (`compiling`,
`plan_stage`, `target_report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from cogvideox_torchax.cli import agreement, errors, out_of_memory, stages, timeline
from cogvideox_torchax.cli.options import RunOptions
from cogvideox_torchax.memory import in_use
from cogvideox_torchax.platforms import accelerators, hlo

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
    error: Exception | None = None  # a many-latents run: why this shape's videos fail (planning failed)
    memory: MemoryPlan | None = None  # --dry-run: the plan, compiled
    plan_s: float = 0.0  # --dry-run: the plan stage's seconds
    target: dict[str, Any] = dataclasses.field(default_factory=dict)  # --dry-run --target: `target_report`

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


def _choose(vae, shape: tuple[int, ...], kind: str | None, stream: bool, target: str | None = None,
            compiling: Callable[[], Any] | None = None) -> ShapePlan:
    """Streamed if it can and its two programs fit the budget (compiled inside ``compiling()``), else whole.

    A stream whose compile runs out of memory decodes whole on the plan,
    which is checked against the budget by its own compiled bytes.
    """
    # A --target report reads the whole decode's compiled bytes and HLO (as the bench does).
    program = "frames" if kind in STREAMED_KINDS and target is None else "decode"
    why = why_not(stream, kind, vae, shape, target)
    if why is not None:
        return ShapePlan(tuple(shape), program, None, why)
    try:
        with compiling() if compiling else contextlib.nullcontext():
            plan = vae.stream_plan(tuple(shape))
    except Exception as e:
        if not out_of_memory.is_out_of_memory(e):
            raise
        return ShapePlan(tuple(shape), program, None, "compiling the streamed decode ran out of memory")
    if plan.budget is not None and plan.bytes > plan.budget:
        return ShapePlan(tuple(shape), program, None, f"the streamed decode needs {plan.bytes / 2**30:.2f} GiB per "
                         f"device, above the {plan.budget / 2**30:.2f} GiB usable")
    return ShapePlan(tuple(shape), program, plan, None)


@dataclasses.dataclass
class Plans:
    """Every batch shape's `ShapePlan`, with the compile stages' seconds and the compile cache as they saw it."""

    by_shape: dict[tuple[int, ...], ShapePlan]
    compile_s: float = 0.0
    cache: str = "on"  # several shapes: the cache is on, each one's hit or miss not told


def make(config, vae, shapes: list[tuple[int, ...]], kind: str | None) -> Plans:
    """Each shape's way, its programs compiled (a compile stage; the plan stage with ``--dry-run``).

    One file: a failure is the run's. Many: a shape that cannot be planned
    fails its videos (``error``), the others go on.
    """
    run, many = config.run, config.output_dir is not None
    out = Plans({})
    for shape in shapes:
        def choose(shape=shape) -> ShapePlan:
            return _choose(vae, shape, kind, config.stream, run.model.target if run.dry_run else None,
                           None if run.dry_run else (lambda: _compiling(out, run, many)))

        try:
            if run.dry_run:
                memory, chosen, stage = plan_stage(vae, shape, "decode", run, choose)
                chosen.memory, chosen.plan_s = memory, stage.seconds
                if run.model.target is not None:
                    with out_of_memory.out_of_memory_as_exit_3("compiling the decode of", shape):
                        chosen.target = target_report(vae, shape, chosen.program, run.model.target, memory)
            else:
                chosen = choose()
                if chosen.streamed is None:
                    guard = out_of_memory.out_of_memory_as_exit_3("compiling the decode of", shape, vae, chosen.program)
                    with agreement.together(f"compiling the decode of shape {shape}"), guard, \
                            _compiling(out, run, many):
                        vae.compile_decode(shape, frames=chosen.program == "frames")
        except Exception as e:
            if not many or run.dry_run or (isinstance(e, errors.PeerFailed) and e.code in errors.SIGNALLED):
                raise
            if run.debug and not isinstance(e, errors.PeerFailed) and agreement.process_count() == 1:
                raise
            chosen = ShapePlan(tuple(shape), "frames" if kind in STREAMED_KINDS else "decode", None, None, e)
        out.by_shape[tuple(shape)] = chosen
    return out


@contextlib.contextmanager
def _compiling(out: Plans, run, many: bool) -> Iterator[None]:
    with compiling(run, shown=not many) as done:
        yield
    out.compile_s += done.seconds
    if not many:
        out.cache = done.cache


class streaming(contextlib.AbstractContextManager):  # noqa: N801 (a context manager, used as a function)
    """Around a streamed decode: out of memory under ``auto`` falls back to the plan (said); under a budget, exit 3.

    The block is then left without the error; ``plan.streamed`` is None.
    """

    def __init__(self, vae, plan: ShapePlan, say: Callable[[str], None]):
        self.vae, self.plan, self.say = vae, plan, say

    def __exit__(self, exc_type, e, tb) -> bool:
        if not isinstance(e, Exception) or not out_of_memory.is_out_of_memory(e):
            return False
        if self.vae.memory_budget()[1] == "max_memory":  # the budget the user gave: out of memory is final
            raise errors.OutOfMemory(out_of_memory.line(e, "decoding latents of", self.plan.shape)) from e
        # As the library's retry does: once more, on the planner's plan.
        self.plan.fall_back("the streamed decode ran out of memory")
        self.say(f"out of memory while streaming latents of shape {self.plan.shape}; "
                 "decoding with the memory plan instead")
        return True


@contextlib.contextmanager
def compiling(run: RunOptions, shown: bool = True) -> Iterator[Compiled]:
    """The "compile" stage around the block (which compiles), counting cache hits: yields its `Compiled` record.

    Not ``shown``: no bar (a many-latents run's shapes compile under its decode bar), a part of the timeline.
    """
    from cogvideox_torchax.vae import compile_cache  # imports JAX: not before the options are checked

    done = Compiled()
    with stages.Stage("compile", 1, "program", run.quiet or not shown, record=shown) as stage:
        with timeline.timed_part("compile") if not shown else contextlib.nullcontext():
            with compile_cache.count_cache_events() as events:
                yield done
        stage.tick()
    done.seconds, done.cache = stage.seconds, events.status
    if run.memory_report:
        in_use.report("compile")


class Compiled:
    """What a compile stage saw: its seconds and the compile cache (``hit``, ``miss``, ...)."""

    seconds = 0.0
    cache = "off"


def plan_stage(vae, shape: tuple[int, ...], kind: str, run: RunOptions,
               choose: Callable[[], Any] | None = None):
    """``--dry-run``'s "plan" stage: the stream's plan where ``choose()`` gives one, else the memory plan.

    ``choose()``: a `plans.ShapePlan` (its ``streamed`` plan, or the
    ``program`` to plan); without it the ``kind`` program is planned.
    Compiled, not run. Returns ``(plan, chosen, stage)``.
    """
    target = run.model.target
    with agreement.together("planning"), out_of_memory.out_of_memory_as_exit_3(f"planning the {kind} of", shape):
        with stages.Stage("plan", 1, "shape", run.quiet) as stage:
            chosen = choose() if choose is not None else None
            plan = (chosen and chosen.streamed) or vae.memory_plan(
                tuple(shape), kind=chosen.program if chosen else kind, target=target,
                mesh=run.model.mesh if target else None)
            stage.tick()
    return plan, chosen, stage


def target_report(vae, shape: tuple[int, ...], kind: str, target: str, plan) -> dict[str, Any]:
    """What ``--dry-run --target`` adds: the target, its program's plan, bytes per device, HLO counts.

    The compile time is the plan stage's (``plan_s``).
    """
    acc = accelerators.get(target)
    mesh = f"dp={plan.mesh[0]},tp={plan.mesh[1]}"
    # The plan's own executable (compiled while planning; not compiled again).
    compiled = (vae.compile_encode(shape, target=target, mesh=mesh) if kind == "encode"
                else vae.compile_decode(shape, target=target, mesh=mesh))
    m = compiled.memory_analysis()
    program = vae.plan_for(acc.platform)
    return {
        "target": {"name": acc.name, "platform": acc.platform, "devices": acc.devices, "budget": acc.budget,
                   "autotune_allowance": acc.autotune_allowance, "description": acc.description},
        "mesh": {"dp": plan.mesh[0], "tp": plan.mesh[1]},
        "plan": program.as_dict(),
        "per_device_bytes": {"temp": int(m.temp_size_in_bytes), "arguments": int(m.argument_size_in_bytes),
                             "outputs": int(m.output_size_in_bytes)},
        "compiled": hlo.compiled_summary(compiled.as_text()),
    }
