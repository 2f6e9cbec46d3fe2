"""Under jax.distributed every process leaves a step with one exit code, and retries out of memory together.

The agreement's rules, with the other processes' reports faked (the real
two-process runs are in test_distributed.py): no cluster, no model.
"""

import argparse

import pytest

from cogvideox_torchax import _cli, budget


@pytest.fixture
def peers(monkeypatch):
    """Makes this process one of two; the other's code for the next gathers is set on the returned list."""
    theirs: list[int] = []
    monkeypatch.setattr(_cli, "_process_count", lambda: 2)
    monkeypatch.setattr(_cli, "is_primary", lambda: True)
    monkeypatch.setattr(_cli, "_gather_codes", lambda code: [code, theirs.pop(0)])
    return theirs


def test_agreed_code_interrupt_wins_else_the_first_failure():
    assert _cli.agreed_code([0, 0]) == 0
    assert _cli.agreed_code([0, 3, 2]) == 3
    assert _cli.agreed_code([2, 130]) == 130


def test_together_gives_every_process_one_code(peers):
    peers.append(3)  # the peer ran out of memory, this one did not fail
    with pytest.raises(_cli.PeerFailed) as e, _cli.together("decoding"):
        pass
    assert e.value.code == 3 and e.value.own is None and "process 1" in str(e.value)

    peers.append(3)  # both failed, this one first: its own error stands
    with pytest.raises(_cli.UsageError), _cli.together("reading"):
        raise _cli.UsageError("bad latents")

    peers.append(130)  # the peer was interrupted: so is this one, its own error kept for the log
    with pytest.raises(_cli.PeerFailed) as e, _cli.together("decoding"):
        raise _cli.OutOfMemory("out of memory")
    assert e.value.code == 130 and isinstance(e.value.own, _cli.OutOfMemory)
    assert _cli.exit_code(e.value) == 130


class _FakeVAE:
    """Plans two ways; records which plan each run used."""

    def __init__(self):
        self.plan = budget.MemoryPlan("whole", None, 100, 200)
        self.options = argparse.Namespace(dtype="float32")
        self.mesh = argparse.Namespace(shape={"dp": 1, "tp": 1})

    def planned(self, shape, kind):
        return self.plan

    def next_plan(self, shape, kind, choose=True):
        smaller = budget.MemoryPlan("tiles of 2x2 latents", {"tile_sample_min_height": 16}, 50, 99)
        if choose:
            self.plan = smaller
        return smaller


def test_out_of_memory_on_a_peer_makes_all_retry_on_the_next_plan(peers):
    vae, ran = _FakeVAE(), []
    args = argparse.Namespace(max_memory="auto", quiet=True)
    peers.extend([3, 0, 0])  # this process's run went through; the peer's ran out, then planned and ran
    out = _cli.retry_out_of_memory(args, vae, (1, 4, 2, 4, 4), "decode", "decoding", lambda: ran.append(vae.plan.name))
    assert ran == ["whole", "tiles of 2x2 latents"] and out is None and not peers  # agreed after each step

    vae, ran = _FakeVAE(), []
    peers.extend([3, 0, 3])  # the peer ran out on the next plan too: this one leaves with it, exit 3
    with pytest.raises(_cli.PeerFailed) as e:
        _cli.retry_out_of_memory(args, vae, (1, 4, 2, 4, 4), "decode", "decoding", lambda: ran.append(1))
    assert e.value.code == 3 and ran == [1, 1] and not peers

    vae, ran = _FakeVAE(), []
    peers.append(3)  # with a fixed budget nobody retries: all leave with exit 3
    with pytest.raises(_cli.PeerFailed) as e:
        _cli.retry_out_of_memory(
            argparse.Namespace(max_memory="1GiB", quiet=True), vae, (1, 4, 2, 4, 4), "decode", "decoding",
            lambda: ran.append(vae.plan.name),
        )
    assert e.value.code == 3 and ran == ["whole"]

    vae, ran = _FakeVAE(), []
    peers.append(2)  # the peer failed otherwise: no retry either
    with pytest.raises(_cli.PeerFailed) as e:
        _cli.retry_out_of_memory(args, vae, (1, 4, 2, 4, 4), "decode", "decoding", lambda: ran.append(1))
    assert e.value.code == 2 and ran == [1]
