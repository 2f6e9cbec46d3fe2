"""Under jax.distributed every process leaves a step with one exit code, and retries out of memory together.

The agreement's rules, with the other processes' reports faked (the real
two-process runs are in tests/parallel/test_distributed.py): no cluster, no model.
"""

import argparse

import pytest

from cogvideox_torchax.cli import agreement, errors, out_of_memory
from cogvideox_torchax.memory import budget, retry


@pytest.fixture
def peers(monkeypatch):
    """Makes this process one of two; the other's code for the next gathers is set on the returned list."""
    theirs: list[int] = []
    monkeypatch.setattr(agreement, "process_count", lambda: 2)
    monkeypatch.setattr(agreement, "is_primary", lambda: True)
    monkeypatch.setattr(agreement, "gather_codes", lambda code: [code, theirs.pop(0)])
    return theirs


def test_agreed_code_interrupt_wins_else_the_first_failure():
    assert errors.agreed_code([0, 0]) == 0
    assert errors.agreed_code([0, 3, 2]) == 3
    assert errors.agreed_code([2, 130]) == 130


def test_together_gives_every_process_one_code(peers):
    peers.append(3)  # the peer ran out of memory, this one did not fail
    with pytest.raises(errors.PeerFailed) as e, agreement.together("decoding"):
        pass
    assert e.value.code == 3 and e.value.own is None and "process 1" in str(e.value)

    peers.append(3)  # both failed, this one first: its own error stands
    with pytest.raises(errors.UsageError), agreement.together("reading"):
        raise errors.UsageError("bad latents")

    peers.append(130)  # the peer was interrupted: so is this one, its own error kept for the log
    with pytest.raises(errors.PeerFailed) as e, agreement.together("decoding"):
        raise errors.OutOfMemory("out of memory")
    assert e.value.code == 130 and isinstance(e.value.own, errors.OutOfMemory)
    assert errors.exit_code(e.value) == 130


class _FakePlanner:
    """Plans two ways; the plan of a shape changes when the smaller one is chosen."""

    def __init__(self):
        self.plan = budget.MemoryPlan("whole", None, 100, 200)
        self.auto = True  # --max-memory auto

    def planned(self, kind, shape):
        return self.plan

    def smaller(self, kind, shape, choose_it=True):
        smaller = budget.MemoryPlan("tiles of 2x2 latents", {"tile_sample_min_height": 16}, 50, 99)
        if choose_it:
            self.plan = smaller
        return smaller


class _FakeVAE:
    """A VAE as the agreed retry sees it; records which plan each run used."""

    def __init__(self):
        self.planner = _FakePlanner()
        self.options = argparse.Namespace(dtype="float32")
        self.mesh = argparse.Namespace(shape={"dp": 1, "tp": 1})

    @property
    def plan(self):
        return self.planner.plan

    def planned(self, shape, kind):
        return self.planner.planned(kind, shape)

    def next_plan(self, shape, kind, choose=True):
        return self.planner.smaller(kind, shape, choose_it=choose)


def _retried(vae, run):
    """``run`` retried as the VAE's own calls retry, inside a command's agreed steps."""
    with out_of_memory.agreed_retry(vae, "decoding", quiet=True):
        return retry.retry_out_of_memory(vae.planner, "decode", (1, 4, 2, 4, 4), run)


def test_out_of_memory_on_a_peer_makes_all_retry_on_the_next_plan(peers):
    vae, ran = _FakeVAE(), []
    peers.extend([3, 0, 0])  # this process's run went through; the peer's ran out, then planned and ran
    out = _retried(vae, lambda: ran.append(vae.plan.name))
    assert ran == ["whole", "tiles of 2x2 latents"] and out is None and not peers  # agreed after each step

    vae, ran = _FakeVAE(), []
    peers.extend([3, 0, 3])  # the peer ran out on the next plan too: this one leaves with it, exit 3
    with pytest.raises(errors.PeerFailed) as e:
        _retried(vae, lambda: ran.append(1))
    assert e.value.code == 3 and ran == [1, 1] and not peers

    vae, ran = _FakeVAE(), []
    vae.planner.auto = False  # --max-memory 1GiB
    peers.append(3)  # with a fixed budget nobody retries: all leave with exit 3
    with pytest.raises(errors.PeerFailed) as e:
        _retried(vae, lambda: ran.append(vae.plan.name))
    assert e.value.code == 3 and ran == ["whole"]

    vae, ran = _FakeVAE(), []
    peers.append(2)  # the peer failed otherwise: no retry either
    with pytest.raises(errors.PeerFailed) as e:
        _retried(vae, lambda: ran.append(1))
    assert e.value.code == 2 and ran == [1]


def test_out_of_memory_here_and_another_failure_on_a_peer_retries_nowhere(peers):
    vae, ran = _FakeVAE(), []

    def run():
        ran.append(vae.plan.name)
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50MiB.")

    peers.append(1)  # this process (first) ran out, the peer failed otherwise: the agreed code is 3, yet no retry
    with pytest.raises(errors.OutOfMemory, match=r"asked 1.50MiB; the plan \(whole\)"):
        _retried(vae, run)
    assert ran == ["whole"] and not peers and vae.plan.name == "whole"
