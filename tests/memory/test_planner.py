"""The planner's rule (`planner.choose`, pure) and the library's own out-of-memory retry (tiny config)."""

import warnings

import jax
import numpy as np
import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.memory import retry
from cogvideox_torchax.memory.budget import Candidate, MemoryBudgetError
from cogvideox_torchax.memory.planner import choose
from cogvideox_torchax.memory.retry import PlanReplacedWarning

_WHOLE = Candidate("whole", None, None)
_TILES = [Candidate(f"tiles {k}", {"k": k}, None) for k in (2, 3, 4)]
_WIDER = Candidate("whole on dp=1,tp=2", None, (1, 2))


def _needs(**by_name):
    seen = []

    def need(c):
        seen.append(c.name)
        return by_name[c.name.replace(" ", "_").replace("=", "").replace(",", "_").replace("/", "")]

    return need, seen


def test_choose_takes_the_first_that_fits_and_measures_nothing_after():
    need, seen = _needs(whole=10, tiles_2=6, tiles_3=4, tiles_4=3)
    choice = choose([_WHOLE, *_TILES], need, usable=5)
    assert choice.chosen is _TILES[1] and choice.need == 4 and seen == ["whole", "tiles 2", "tiles 3"]


def test_choose_skips_smaller_tiles_once_they_stop_saving_but_tries_wider_meshes():
    need, seen = _needs(whole=10, tiles_2=8, tiles_3=9, tiles_4=1, whole_on_dp1_tp2=5)
    choice = choose([_WHOLE, *_TILES, _WIDER], need, usable=5)
    assert choice.chosen is _WIDER and seen == ["whole", "tiles 2", "tiles 3", "whole on dp=1,tp=2"]
    need, seen = _needs(whole=10, tiles_2=8, tiles_3=9, tiles_4=1)
    nothing = choose([_WHOLE, *_TILES], need, usable=5)
    assert nothing.chosen is None and nothing.need is None and [c.name for c, _ in nothing.tried] == seen


SHAPE = (1, 4, 1, 8, 12)


def _exhaust_whole_once(monkeypatch):
    """The device runs out of memory the first time each VAE's whole program runs."""
    real = ct.TorchaxVAE.prepare
    runs, failed = [], set()

    def prepare(self, kind, x, inputs=()):
        executable, args = real(self, kind, x, inputs)
        name = self.planned(tuple(x.shape), kind=kind).name
        runs.append(name)

        def run(*a):
            if name == "whole" and id(self) not in failed:
                failed.add(id(self))
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50MiB.")
            return executable(*a)

        return run, args

    monkeypatch.setattr(ct.TorchaxVAE, "prepare", prepare)
    return runs


def test_library_retries_once_on_the_next_plan_under_auto(tiny_upstream, monkeypatch):
    runs = _exhaust_whole_once(monkeypatch)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    z = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    with pytest.warns(PlanReplacedWarning, match=r"out of memory running the whole program .* retrying once with the tiles of"):
        video = vae.decode(z).sample
    assert runs[0] == "whole" and runs[1].startswith("tiles of") and vae.planned(SHAPE).name == runs[1]
    assert tuple(video.shape) == (1, 3, 1, 64, 96) and np.isfinite(video.numpy()).all()


def test_library_does_not_retry_with_a_given_budget_or_below_the_smallest_plan(tiny_upstream, monkeypatch):
    runs = _exhaust_whole_once(monkeypatch)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory="1GiB")
    z = np.zeros(SHAPE, np.float32)
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        vae.decode(z)
    assert runs == ["whole"]


def test_the_vaes_retry_takes_the_steps_its_caller_gives(tiny_upstream, monkeypatch):
    # A command gives the steps (every process together); the retry stays the VAE's own, the only one:
    # the VAE's run fails once, and the replaced plan is told by the given steps alone.
    runs = _exhaust_whole_once(monkeypatch)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    z = np.zeros(SHAPE, np.float32)
    taken = []

    class Told(retry.Alone):
        def run(self, step, fn):
            taken.append(step)
            return fn()

        def replaced(self, failed, smaller, shape):
            taken.append(f"replaced {failed.name} for {shape}")

    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanReplacedWarning)  # told by the given steps, not the library's warning
        with retry.taken_by(lambda kind, shape: Told()):
            video = vae.decode(z).sample
    assert taken == ["first", "plan", f"replaced whole for {SHAPE}", "last"]
    assert runs[0] == "whole" and runs[1].startswith("tiles of") and len(runs) == 2
    assert tuple(video.shape) == (1, 3, 1, 64, 96)


def test_no_smaller_plan_keeps_the_out_of_memory_error(tiny_upstream, monkeypatch):
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")

    def smaller(kind, shape, choose_it=True):
        raise MemoryBudgetError("no smaller plan")

    monkeypatch.setattr(vae.planner, "smaller", smaller)
    _exhaust_whole_once(monkeypatch)
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        vae.decode(np.zeros(SHAPE, np.float32))
