"""`wan_tail_chunks`: on by default on TPU with tp >= 4, elsewhere off unless set; upstream's values."""

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.families.wan.patches.tail_chunks import tail_start
from cogvideox_torchax.platforms import hlo
from cogvideox_torchax.platforms.build import build_plan
from cogvideox_torchax.platforms.run_plan import Placement
from tests.support.compilers import require_compiler
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode

_TINY = (1, 16, 3, 8, 16)  # the first latent frame and two scan steps


def _tail(upstream, dtype="float32"):
    return ct.wrap(upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(dtype=dtype, wan_tail_chunks=True))


def test_on_by_default_on_tpu_at_tp_4_and_above_and_wherever_set_true(wan_tiny):
    auto = ct.RuntimeOptions(dtype="bfloat16")
    forced = ct.RuntimeOptions(dtype="bfloat16", wan_tail_chunks=True)
    for platform in ("cpu", "cuda", "rocm", "tpu"):
        for tp in (1, 2, 4, 8):
            plan = build_plan(auto, Placement(platform, "bfloat16", 1, tp), "wan")
            on = platform == "tpu" and tp >= 4
            assert ("wan_tail_chunks" in plan.steps) == on, (platform, tp)
            if not on:
                assert dict(plan.skipped)["wan_tail_chunks"].startswith("off unless set True: "), (platform, tp)
            assert "wan_tail_chunks" in build_plan(forced, Placement(platform, "bfloat16", 1, tp), "wan").steps
    assert "wan_tail_chunks" not in wan_tiny.plan_for("tpu").steps  # its own mesh: one device
    off = ct.RuntimeOptions(dtype="bfloat16", wan_tail_chunks=False)
    assert "wan_tail_chunks" not in build_plan(off, Placement("tpu", "bfloat16", 1, 8), "wan").steps


def test_the_tail_starts_after_the_last_time_upsampler(wan_tiny_upstream, wan22_tiny_upstream):
    # Both tiny decoders upsample in time in their first two up blocks (as Wan 2.1 and 2.2 do).
    for upstream in (wan_tiny_upstream, wan22_tiny_upstream):
        assert list(upstream.decoder.temperal_upsample) == [True, True, False]
        assert tail_start(upstream.decoder) == 2


# Frame counts: the first latent frame alone (1: one piece), one scan step
# (2), several (5); odd and non-square sizes; Wan 2.2's residual blocks.
@pytest.mark.parametrize("shape", [(1, 16, 1, 4, 4), (1, 16, 2, 3, 5), (1, 16, 5, 5, 3)])
def test_wan_tiny_decodes_as_upstream_in_fp32(wan_tiny_upstream, shape):
    z = seeded_latents(shape, seed=shape[2])
    # fp32: the largest seen here is 6e-7, as without the patch.
    assert_close(_tail(wan_tiny_upstream).decode(z).sample, upstream_decode(wan_tiny_upstream, z), atol=1e-5,
                 label=f"wan-tiny tail chunks fp32 {shape}")


@pytest.mark.parametrize("shape", [(1, 4, 2, 2, 3), (1, 4, 5, 3, 2)])
def test_wan22_tiny_decodes_as_upstream_in_fp32(wan22_tiny_upstream, shape):
    z = seeded_latents(shape, seed=shape[2])
    assert_close(_tail(wan22_tiny_upstream).decode(z).sample, upstream_decode(wan22_tiny_upstream, z), atol=1e-5,
                 label=f"wan2.2-tiny tail chunks fp32 {shape}")


def test_h200_program_is_smaller_and_keeps_the_invariants():
    require_compiler("cuda")
    upstream = ct.random_upstream("wan-tiny", seed=0)
    found = {}
    for on in (False, True):
        options = ct.RuntimeOptions(dtype="bfloat16", wan_tail_chunks=on)
        compiled = ct.wrap(upstream, mesh="dp=1,tp=1", options=options).compile_decode(_TINY, target="h200")
        convs, moves = hlo.compiled_ops(compiled.as_text())
        assert {c.dim_labels for c in convs} == {"bf012_oi012->bf012"} and {c.dtype for c in convs} == {"bf16"}
        assert [m for m in moves if m.moves_data_to_another_layout and m.elements >= 8 * 16] == []
        found[on] = (compiled.memory_analysis().temp_size_in_bytes, max(c.elements for c in convs))
    # The full-resolution convolutions see 2 frames, not 4 (1.46 -> 1.27 MB of temporaries here).
    assert found[True][1] * 2 == found[False][1]
    assert found[True][0] < found[False][0]


def test_the_switches_page_says_where_it_is_off_by_default():
    from cogvideox_torchax.patches.registry import switches_markdown

    rows = [line for line in switches_markdown().splitlines() if "`wan_tail_chunks`" in line]
    assert len(rows) == 1 and "**off by default where its plan says why.**" in rows[0] and "TPU" in rows[0]
