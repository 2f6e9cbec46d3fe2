"""Memory budgets: sizes parsed, and the plan a budget picks from compiled bytes before anything runs (tiny config)."""

import re

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.memory import budget
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode

# Measured on a 2-core CPU (jax 0.10.2): the whole decode of (1,4,2,16,24) compiles to 40.5 MB
# (temporaries + arguments + outputs), tiles of 12x15 latents to 40.3 MB, of
# 6x10 to 9.5 MB, of 6x5 to 9.2 MB.
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
    assert plan.name == "tiles of 6x10 latents" and plan.bytes <= plan.budget == int(20_000_000 * 0.9)
    assert vae.compiled_shapes() == [_SHAPE]
    twin = ct.random_upstream("tiny", seed=0)
    twin.enable_tiling(**plan.tiling)
    # Tiling changes results only as upstream's own tiled decode does, and
    # the planner's tiles keep the whole video's size.
    assert_close(got, upstream_decode(twin, z), atol=2e-5, label=f"planned {plan.name}")
    assert got.shape == (1, 3, 8, 128, 192)
    assert not vae.use_tiling  # the VAE's own switch is left as it was


def test_a_budget_smaller_than_any_plan_is_refused_before_running(tiny_upstream):
    # (1,4,1,8,12): whole and tiles of 6x10 latents 1.25 MB (1.2 MiB), of 6x5 0.71 MB (0.7 MiB).
    shape = (1, 4, 1, 8, 12)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory=500_000)
    with pytest.raises(ct.MemoryBudgetError, match=r"no plan for the decode of \(1, 4, 1, 8, 12\) fits") as err:
        vae.decode(torch.zeros(shape))
    message = str(err.value)
    figures = dict(re.findall(r"(whole|tiles of \S+ latents) (\d+\.\d) MiB", message))
    assert set(figures) == {"whole", "tiles of 6x10 latents", "tiles of 6x5 latents"}, message
    # Every plan is named with a figure over the 450,000 bytes usable (0.43 MiB), in MiB.
    assert all(0.43 < float(v) < 4 for v in figures.values()) and "0.5 MB" not in message
    assert vae.compiled_shapes() == []


def test_wrap_refuses_a_bad_budget(tiny_upstream):
    with pytest.raises(ValueError, match="memory budget"):
        ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory="a lot")


def test_the_encode_is_planned_too(tiny_vae):
    plan = tiny_vae.memory_plan((1, 3, 9, 64, 96), kind="encode")
    assert plan.name == "whole" and 0 < plan.bytes <= plan.budget
    assert tiny_vae.compiled_shapes("encode")[-1] == (1, 3, 9, 64, 96)


@pytest.mark.parametrize(("frame", "overlaps"), [((60, 90), (1 / 6, 1 / 5)), ((96, 170), (1 / 6, 1 / 5)), ((16, 24), (0.25, 0.25))])
def test_candidate_tiles_keep_upstreams_grid_consistent(frame, overlaps):
    # Upstream crops each tile to tile - int(tile * overlap) pixels and steps by
    # int(latent tile * (1 - overlap)): the candidates make these agree, so a
    # tiled video has the whole video's size.
    from cogvideox_torchax.families.cogvideox import tiling as cogvideox_tiling

    for tiling in (kw for _, kw in cogvideox_tiling.tiles(frame, 8, overlaps, budget.TILE_COUNTS)):
        for px, overlap in zip((tiling["tile_sample_min_height"], tiling["tile_sample_min_width"]), overlaps):
            assert px - int(px * overlap) == 8 * int(px // 8 * (1 - overlap))


class _Chip:
    def __init__(self, platform, bytes_limit):
        self.platform, self.process_index, self._limit = platform, 0, bytes_limit
        self.device_kind = "TPU v6 lite" if platform == "tpu" else "NVIDIA H200"

    def memory_stats(self):
        return {"bytes_limit": self._limit}


def test_programs_for_an_attached_tpu_are_told_its_usable_hbm(tiny_vae, monkeypatch):
    import numpy as np

    from cogvideox_torchax.vae.program_cache import ProgramKey

    class Mesh:  # the devices a mesh holds are all the budget reads
        def __init__(self, platform):
            self.devices = np.array([_Chip(platform, int(31.25 * 2**30))])

    # One v6e chip attached: 90 % of its 31.25 GiB, as a named v6e-1 target gets.
    assert budget.attached_compiler_options(Mesh("tpu")) == {"xla_tpu_max_hbm_size_mib": "28800"}
    assert budget.attached_compiler_options(Mesh("gpu")) is None
    assert budget.attached_compiler_options(tiny_vae.mesh) is None  # the CPU: no such option
    # The program cache asks for it for the devices it runs on (here the CPU: only the plan's own options).
    seen = []
    monkeypatch.setattr(budget, "attached_compiler_options", lambda mesh: seen.append(mesh) or {"x": "1"})
    assert tiny_vae.programs.compiler_options(ProgramKey())["x"] == "1" and seen == [tiny_vae.mesh]
    assert tiny_vae.compiler_options["x"] == "1"


def test_compiled_bytes_allow_for_what_the_host_convolutions_take():
    import jax
    import jax.numpy as jnp

    from cogvideox_torchax.kernels.host_conv import host_conv

    def own(compiled) -> int:
        m = compiled.memory_analysis()
        return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes

    kw = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    x, w4, w8 = jnp.zeros((1, 4, 16, 16)), jnp.zeros((8, 4, 3, 3)), jnp.zeros((2, 8, 3, 3))
    compiled = jax.jit(lambda x: host_conv(host_conv(x, w4, None, **kw), w8, None, **kw)).lower(x).compile()
    # torch's tensor of the largest host result and oneDNN's copies, outside XLA's count: twice 8x16x16 fp32.
    assert budget.compiled_bytes(compiled) == own(compiled) + 2 * 8 * 16 * 16 * 4
    plain = jax.jit(lambda x: x * 2).lower(x).compile()
    assert budget.compiled_bytes(plain) == own(plain)
