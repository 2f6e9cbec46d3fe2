"""The decode as a stream: one latent frame batch at a time, each result leaving the device while the next decodes.

Upstream's ``_decode`` walks the latent frames in batches (its family's:
CogVideoX's pairs with the odd remainder first, Wan's single frames) and
threads the causal convolutions' caches from batch to batch. Here that walk
is two compiled programs whose shapes do not depend on the video's length:
the first batch, and one later batch (the cache in and out); each call's
output is copied to the host while the next call runs.
Device memory holds the weights (on the CPU with the decoder's convolution
weights transposed beside them: `vae.weight_layout`), the cache and at most
``in_flight`` batch outputs whatever the length; the host holds what the caller keeps. `plan`
compiles both programs for a shape without running them and sets their
bytes against the VAE's budget (`TorchaxVAE.stream_plan`).
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from cogvideox_torchax.memory import budget
from cogvideox_torchax.parallel import sharding
from cogvideox_torchax.vae import drawn_noise
from cogvideox_torchax.vae.program_cache import _INT64_WARNING, TRACING, ProgramKey

if TYPE_CHECKING:
    from cogvideox_torchax.vae.program_cache import ProgramCache

OUTPUTS = ("frames", "video")


@dataclasses.dataclass(frozen=True)
class VideoChunk:
    """One latent frame batch's share of the decoded video.

    Attributes:
        data: ``"frames"``: uint8 ``(B, F, H, W, 3)`` as diffusers' video
            processor maps them; ``"video"``: the decoder's output
            ``(B, 3, F, H, W)`` in the VAE's dtype, unclamped as upstream.
        finite: ``(B,)``, whether each video's decoder output in this chunk
            held no NaN or Inf.
        start: the index of the chunk's first frame in the whole video.
        frames: how many video frames the chunk holds.
    """

    data: np.ndarray
    finite: np.ndarray
    start: int
    frames: int


def why_not_streamed(module: Any, shape: tuple[int, ...], programs: ProgramCache) -> str | None:
    """Why latents of ``shape`` cannot stream on the own program, or None."""
    if jax.process_count() > 1:
        return ("the stream runs in one process: under jax.distributed each process holds only its own devices' "
                "frames (decode_frames_jax, then gather)")
    _, _, _, height, width = shape
    if programs.family.tiles(module, (height, width)):
        return ("tiled decodes do not stream: upstream's tiled decode walks every frame of one tile before "
                "the next tile, so no frame is complete before the last tile (disable_tiling, or decode whole)")
    needs = programs.family.stream_needs
    if needs is not None and not programs.own.plan.applies(needs):
        return f"streaming needs {needs}: without it the first batch's conv cache differs from the later ones'"
    return None


def _compile(programs: ProgramCache, first: bool, output: str, shape: tuple[int, ...], cache: Any,
             cache_out: bool = True) -> Any:
    """The own program's first-batch or later-batch executable for a batch of ``shape`` (kept per shape).

    ``cache_out`` False: the first batch is the whole video, and its program
    returns no cache (None), as the whole decode computes none.
    """
    key = ProgramKey()
    name = f"stream_{'first' if first else 'step'}_{output}" + ("" if cache_out else "_only")
    with programs.lock:
        program = programs.program(key)
        if (name, shape) not in program.executables:
            where = sharding.input_sharding(shape, programs.mesh)
            spec = jax.ShapeDtypeStruct(shape, programs.options.jax_dtype, sharding=where)
            inputs = programs.input_specs(shape, programs.mesh, program)
            with TRACING, warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_INT64_WARNING)
                args = (programs.weight_specs(key, "decode"), spec, None if first else cache, inputs)
                lowered = program.stream_jits[first, output, cache_out].trace(*args).lower()
            program.executables[name, shape] = lowered.compile(compiler_options=programs.compiler_options(key))
        return program.executables[name, shape]


def _cache_specs(executable: Any) -> Any:
    """The conv cache a first-batch executable returns, as shapes and shardings the next one takes."""
    _, cache_info = executable.out_info
    _, cache_shardings = executable.output_shardings
    return jax.tree.map(lambda info, s: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=s), cache_info,
                        cache_shardings)


def executables(programs: ProgramCache, shape: tuple[int, ...], output: str) -> tuple[Any, Any]:
    """The first-batch executable and the later-batch one (None for a single batch) for latents of ``shape``."""
    ranges = programs.family.stream_batches(programs.own.module, shape[2])
    b, c, _, h, w = shape
    first = _compile(programs, True, output, (b, c, ranges[0][1], h, w), None, cache_out=len(ranges) > 1)
    if len(ranges) == 1:
        return first, None
    (start, stop) = ranges[1]
    return first, _compile(programs, False, output, (b, c, stop - start, h, w), _cache_specs(first))


def streamed_bytes(first: Any, step: Any, in_flight: int) -> int:
    """Per device: the larger program's compiled bytes, and ``in_flight`` batch outputs besides."""
    programs = [e for e in (first, step) if e is not None]
    out = max(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(e.out_info[0])) for e in programs)
    return max(budget.compiled_bytes(e) for e in programs) + in_flight * out


def plan(vae: Any, shape: tuple[int, ...], output: str = "frames", in_flight: int = 2) -> budget.MemoryPlan:
    """The stream's plan for latents of ``shape`` (`TorchaxVAE.stream_plan`): both programs compiled, nothing run.

    Raises:
        ValueError: a shape or plan that does not stream (`why_not_streamed`).
    """
    why = why_not_streamed(vae.module, shape, vae.programs)
    if why:
        raise ValueError(f"decode_stream: {why}")
    first, step = executables(vae.programs, shape, output)
    total, _ = vae.memory_budget()
    return budget.MemoryPlan("streamed", None, streamed_bytes(first, step, in_flight), budget.usable(total))


def stream(
    programs: ProgramCache, module: Any, z: np.ndarray, *, output: str = "frames", in_flight: int = 2,
    inputs: tuple[np.ndarray, ...] = (),
) -> Iterator[VideoChunk]:
    """Decodes ``z`` ``(B, C, T, H, W)`` batch by batch; yields a `VideoChunk` per latent frame batch, in order.

    ``inputs``: the family's decode inputs (`Family.decode_input_values`), each ``(B,)``.

    Raises:
        ValueError: an unknown ``output``, ``in_flight`` below 1, or a plan
            that cannot stream (`why_not_streamed`).
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise ValueError(f"in_flight must be an int >= 1, got {in_flight!r}")
    why = why_not_streamed(module, tuple(z.shape), programs)
    if why:
        raise ValueError(f"decode_stream: {why}")
    return _chunks(programs, module, z, output, in_flight, inputs)  # checked now, decoded as the caller iterates


def _chunks(programs: ProgramCache, module: Any, z: np.ndarray, output: str, in_flight: int,
            inputs: tuple[np.ndarray, ...]) -> Iterator[VideoChunk]:
    ranges = programs.family.stream_batches(module, z.shape[2])
    mesh, weights = programs.mesh, programs.weights_for(ProgramKey(), "decode")

    def place(start: int, stop: int) -> jax.Array:
        part = np.ascontiguousarray(z[:, :, start:stop])
        return sharding.place(part, sharding.input_sharding(part.shape, mesh))

    def to_host(out: Any, start: int, frames: int) -> VideoChunk:
        data, finite = out
        return VideoChunk(np.asarray(data), np.asarray(finite), start, frames)

    first, step = executables(programs, tuple(z.shape), output)
    dtype = np.dtype(programs.options.jax_dtype)
    placed = tuple(sharding.place(v.astype(dtype), sharding.input_sharding(v.shape, mesh)) for v in inputs)
    pending: collections.deque = collections.deque()
    cache = None
    frame = 0
    for i, (start, stop) in enumerate(ranges):
        x = place(start, stop)
        executable = first if i == 0 else step
        # Noise upstream's decode draws (`drawn_noise`), drawn for this batch as its program takes it; none for most.
        wanted = [a.shape for a in executable.args_info[0][3][len(inputs):]]
        noise = tuple(sharding.place(a.astype(dtype), sharding.replicated(mesh))
                      for a in drawn_noise.draw(wanted, programs.options.torch_dtype))
        out, cache = executable(weights, x, None if i == 0 else cache, placed + noise)
        for array in jax.tree.leaves(out):
            array.copy_to_host_async()
        count = out[0].shape[1 if output == "frames" else 2]
        pending.append((out, frame, count))
        frame += count
        while len(pending) > in_flight:
            yield to_host(*pending.popleft())
    del cache
    while pending:
        yield to_host(*pending.popleft())
