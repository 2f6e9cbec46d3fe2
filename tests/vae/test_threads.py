"""One `TorchaxVAE` shared by threads: each shape compiled once, results as single-threaded, failures leave nothing.

Every test builds its own VAE of this module's own upstream module (built
here, so no other test's change to a shared one reaches it; a reference VAE
of it gives the single-threaded references), starts its threads together at a barrier and
compares results exactly with ``np.array_equal``: the same program on the
same weights and inputs gives the same bits, whichever thread runs it.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.memory.planner import key_of
from cogvideox_torchax.vae.program_cache import ProgramCache

SHAPES = [(1, 4, t, 4, 4) for t in (1, 2, 3)]  # three latent shapes, each its own program
VIDEO = (1, 3, 1, 32, 32)  # encodes to (1, 8, 1, 4, 4)


def _fresh(tiny_upstream, **kwargs) -> ct.TorchaxVAE:
    return ct.wrap(tiny_upstream, dtype=kwargs.pop("dtype", "float32"), mesh="dp=1,tp=1", **kwargs)


def _latents(shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(shape[2]))


def _numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
    return np.asarray(jax.device_get(x))


def _in_threads(n: int, work: Callable[[int], Any], timeout: float = 300) -> list[Any]:
    """``work(i)`` in ``n`` threads started together; their results in order, or the first error raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as e:  # re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish (deadlock?)"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def tiny_upstream():
    """diffusers' tiny test config with seeded random weights, this module's own."""
    return ct.random_upstream("tiny", seed=0)


@pytest.fixture(scope="module")
def tiny_vae(tiny_upstream):
    """The single-threaded reference VAE."""
    return _fresh(tiny_upstream)


@pytest.fixture(scope="module")
def references(tiny_vae):
    """Single-threaded decodes of `SHAPES` by the session's VAE, as NumPy."""
    return {shape: tiny_vae.decode(_latents(shape)).sample.numpy() for shape in SHAPES}


def _count_lowerings(monkeypatch) -> Counter:
    """Counts `ProgramCache.lower` calls (each trace and compile of a program) by ``(kind, shape)``."""
    counts: Counter = Counter()
    real = ProgramCache.lower

    def lower(self, kind, shape, key):
        counts[kind, tuple(shape)] += 1
        return real(self, kind, shape, key)

    monkeypatch.setattr(ProgramCache, "lower", lower)
    return counts


def test_four_threads_three_new_shapes_five_calls_each_equal_single_threaded(tiny_upstream, references, monkeypatch):
    counts = _count_lowerings(monkeypatch)
    vae = _fresh(tiny_upstream)
    inputs = {shape: _latents(shape) for shape in SHAPES}

    def work(i: int) -> list[tuple[tuple, np.ndarray]]:
        order = random.Random(i).choices(SHAPES, k=5)  # each thread its own seeded order
        out = []
        for n, shape in enumerate(order):
            z = inputs[shape]
            # torch in, torch out; or NumPy in, JAX out: the same program either way.
            result = vae.decode(z).sample if (i + n) % 2 == 0 else vae.decode_jax(z.numpy())
            out.append((shape, _numpy(result)))
        return out

    results = _in_threads(4, work)
    assert sum(len(r) for r in results) == 20
    for per_thread in results:
        for shape, got in per_thread:
            assert got.dtype == np.float32 and np.array_equal(got, references[shape]), shape
    # Each shape compiled once, whichever threads asked first.
    used = {shape for per_thread in results for shape, _ in per_thread}
    assert {k: v for k, v in counts.items()} == {("decode", shape): 1 for shape in used}
    assert sorted(vae.compiled_shapes()) == sorted(used)


def test_concurrent_first_calls_of_one_shape_compile_it_once(tiny_upstream, references, monkeypatch):
    counts = _count_lowerings(monkeypatch)
    vae = _fresh(tiny_upstream)
    shape = SHAPES[1]
    z = _latents(shape)
    results = _in_threads(4, lambda i: vae.decode(z).sample.numpy())
    assert counts == Counter({("decode", shape): 1})
    assert vae.compiled_shapes() == [shape]
    for got in results:
        assert np.array_equal(got, references[shape])


def test_ahead_of_time_calls_and_encode_from_threads_equal_single_threaded(tiny_upstream, tiny_vae, monkeypatch):
    shape = SHAPES[0]
    z = _latents(shape)
    x = torch.rand(VIDEO, generator=torch.Generator().manual_seed(5)) * 2 - 1
    want_frames = [_numpy(a) for a in tiny_vae.decode_frames_jax(z)]
    want_moments = _numpy(tiny_vae.encode_jax(x))
    want_plan = tiny_vae.memory_plan(shape)
    counts = _count_lowerings(monkeypatch)
    vae = _fresh(tiny_upstream)

    calls = [
        lambda: vae.memory_plan(shape),
        lambda: vae.compile_decode(shape, frames=True),
        lambda: [_numpy(a) for a in vae.decode_frames_jax(z)],
        lambda: vae.encode(x).latent_dist,
        lambda: vae.compile_encode(VIDEO),
        lambda: vae.lower_decode(shape),
    ]
    results = _in_threads(len(calls), lambda i: calls[i]())
    plan, frames_program, frames, posterior, encode_program, lowered = results
    assert plan.name == want_plan.name == "whole" and plan == vae.memory_plan(shape)
    assert all(np.array_equal(g, w) for g, w in zip(frames, want_frames, strict=True))
    assert np.array_equal(torch.cat([posterior.mean, posterior.logvar], 1).numpy(), want_moments)
    # The executables handed out are the ones kept and run.
    assert frames_program is vae.compile_decode(shape, frames=True)
    assert encode_program is vae.compile_encode(VIDEO)
    assert "stablehlo" in lowered.as_text() or "func" in lowered.as_text()
    # Frames and encode compiled once each; the decode once for its plan and
    # once traced by lower_decode (which keeps nothing).
    assert counts == Counter({("frames", shape): 1, ("encode", VIDEO): 1, ("decode", shape): 2})
    assert vae.compiled_shapes() == [shape] and vae.compiled_shapes("encode") == [VIDEO]


def test_a_decode_overlapping_a_dtype_change_runs_wholly_in_one_dtype(tiny_upstream, references):
    shape = SHAPES[0]
    z = _latents(shape)
    vae = _fresh(tiny_upstream)

    def work(i: int) -> list[tuple[torch.dtype, np.ndarray]]:
        if i == 0:
            vae.to(torch.bfloat16)
            return []
        out = []
        for _ in range(3):
            sample = vae.decode(z).sample
            out.append((sample.dtype, _numpy(sample)))
        return out

    results = _in_threads(3, work)
    assert vae.dtype == torch.bfloat16 and vae.weights[next(iter(vae.weights))].dtype == jax.numpy.bfloat16
    # Every result is wholly fp32's or wholly bf16's (as the VAE decodes now).
    after = vae.decode(z).sample
    assert after.dtype == torch.bfloat16 and not np.array_equal(_numpy(after), references[shape])
    want = {torch.float32: references[shape], torch.bfloat16: _numpy(after)}
    for dtype, got in (r for per_thread in results for r in per_thread):
        assert np.array_equal(got, want[dtype]), dtype


def test_a_compile_that_fails_leaves_nothing_and_the_shape_decodes_again(tiny_upstream, references, monkeypatch):
    vae = _fresh(tiny_upstream)
    shape = SHAPES[2]
    z = _latents(shape)
    real = jax.stages.Lowered.compile
    failures = []

    def compile_fails_once(self, *args, **kwargs):
        if not failures:
            failures.append(1)
            raise RuntimeError("compile failed on purpose")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_fails_once)
    with pytest.raises(RuntimeError, match="on purpose"):
        vae.decode(z)
    assert failures and vae.planned(shape) is None and vae.compiled_shapes() == []
    assert vae.programs.compiled("decode", shape, vae.programs.platform_key(None)) is None
    assert np.array_equal(vae.decode(z).sample.numpy(), references[shape])
    assert vae.compiled_shapes() == [shape]


def test_a_trace_that_fails_midway_leaves_nothing_and_the_shape_decodes_again(tiny_upstream, references):
    # Upstream's decoder raises while traced, its parameters swapped for the
    # traced weights: they are put back, and JAX keeps no broken trace.
    vae = _fresh(tiny_upstream)
    shape = SHAPES[1]
    z = _latents(shape)
    decoder = vae.module.decoder
    params = {name: p for name, p in decoder.named_parameters()}

    def boom(*args, **kwargs):
        raise RuntimeError("trace failed on purpose")

    decoder.forward = boom
    try:
        results = _in_threads(2, lambda i: pytest.raises(RuntimeError, vae.decode, z))
    finally:
        del decoder.forward
    assert all("on purpose" in str(r.value) for r in results)
    assert {name: p for name, p in decoder.named_parameters()} == params
    assert all(type(p) is torch.nn.Parameter for p in params.values())
    assert vae.planned(shape) is None and vae.compiled_shapes() == []
    assert np.array_equal(vae.decode(z).sample.numpy(), references[shape])


def test_a_plan_that_fails_midway_keeps_none_of_its_candidates(tiny_upstream, monkeypatch):
    # No budget fits the whole decode; compiling the first tiled candidate
    # fails: the whole program compiled for the plan is not kept either.
    vae = _fresh(tiny_upstream, max_memory=1)
    shape = (1, 4, 1, 8, 12)  # wide enough for tiled candidates
    whole, tiled = vae.planner.candidates("decode", shape)[:2]
    assert whole.tiling is None and tiled.tiling is not None
    real = jax.stages.Lowered.compile
    compiles = []

    def second_compile_fails(self, *args, **kwargs):
        compiles.append(1)
        if len(compiles) == 2:
            raise RuntimeError("compile failed on purpose")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", second_compile_fails)
    with pytest.raises(RuntimeError, match="on purpose"):
        vae.memory_plan(shape)
    assert len(compiles) == 2 and vae.planned(shape) is None
    for c in (whole, tiled):
        assert vae.programs.compiled("decode", shape, key_of(c)) is None, c.name
