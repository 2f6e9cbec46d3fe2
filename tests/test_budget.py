"""The memory planner: plans chosen from compiled bytes before anything runs (tiny config, CPU)."""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax import budget
from tests.conftest import seeded_latents, upstream_decode
from tests.parity import assert_close

# Measured on this CPU: the whole decode of (1,4,2,16,24) compiles to 40.5 MB
# (temporaries + arguments + outputs), 2x2-ish tiles of 8x12 latents to 13.8 MB,
# the smallest candidate to 10.1 MB.
_SHAPE = (1, 4, 2, 16, 24)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("auto", None), (None, None), ("16GiB", 16 * 2**30), ("8 GB", 8 * 10**9), ("1.5G", int(1.5 * 2**30)),
     ("512MiB", 512 * 2**20), (4096, 4096)],
)
def test_parse_memory(text, expected):
    assert budget.parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "16", "16 GiBs", "-1GiB", "0GB", "1e9", "GiB", True, 0, 2.5])
def test_parse_memory_refuses_garbage(text):
    with pytest.raises(ValueError, match="memory budget"):
        budget.parse_memory(text)


def test_auto_budget_is_the_whole_decode_when_it_fits(tiny_vae):
    plan = tiny_vae.memory_plan(_SHAPE)
    assert plan.name == "whole" and plan.tiling is None and 0 < plan.bytes <= plan.budget


def test_a_small_budget_picks_tiling_that_equals_upstreams_tiled_decode(tiny_upstream):
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory=20_000_000)
    z = seeded_latents(_SHAPE, seed=5)
    got = vae.decode(z).sample
    plan = vae.memory_plan(_SHAPE)
    assert plan.tiling is not None and plan.bytes <= plan.budget == int(20_000_000 * 0.9)
    assert vae.compiled_shapes() == [_SHAPE]
    twin = ct.random_upstream("tiny", seed=0)
    twin.enable_tiling(**plan.tiling)
    # Tiling changes results only as upstream's own tiled decode does.
    assert_close(got, upstream_decode(twin, z), atol=2e-5, label=f"planned {plan.name}")
    assert not vae.use_tiling  # the VAE's own switch is left as it was


def test_a_budget_smaller_than_any_plan_is_refused_before_running(tiny_upstream):
    # (1,4,1,8,12): whole 1.27 MB, tiles of 4x6 latents 0.77 MB, 3x4 0.71 MB,
    # 2x3 0.84 MB (more than 3x4: the planner stops there).
    shape = (1, 4, 1, 8, 12)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory=500_000)
    with pytest.raises(ct.MemoryBudgetError, match=r"no plan for the decode of \(1, 4, 1, 8, 12\) fits") as err:
        vae.decode(torch.zeros(shape))
    message = str(err.value)
    assert "whole 0.001 GiB" in message and "tiles of 3x4 latents" in message and "2x2" not in message
    assert vae.compiled_shapes() == []


def test_wrap_refuses_a_bad_budget(tiny_upstream):
    with pytest.raises(ValueError, match="memory budget"):
        ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory="a lot")


def test_the_encode_is_planned_too(tiny_vae):
    plan = tiny_vae.memory_plan((1, 3, 9, 64, 96), kind="encode")
    assert plan.name == "whole" and 0 < plan.bytes <= plan.budget
    assert tiny_vae.compiled_shapes("encode")[-1] == (1, 3, 9, 64, 96)
