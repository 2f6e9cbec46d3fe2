"""Wan's CUDA and TPU programs keep CogVideoX's invariants: bf16 convolutions, no activation moved around them, < 2^31.

Lowered here for each platform and compiled by the targets' own compilers
(the ``aot`` extra) at the tiny config's size; the figures at Wan 2.1's
480p and 720p are on docs/results/wan-compiled-targets-2026-11-28.md.
"""

import math

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.platforms import hlo
from tests.support import stablehlo_rules as escapes
from tests.support.compilers import require_compiler

_TINY = (1, 16, 3, 8, 16)  # the first latent frame and two scan steps: every resampler, the attention


@pytest.fixture(scope="module")
def wan_bf16():
    return ct.wrap(ct.random_upstream("wan-tiny", seed=0), dtype="bfloat16", mesh="dp=1,tp=1")


def _smallest_activation() -> int:
    # The tiny decoder's narrowest activation: 1 channel (its later up blocks take half of 3) at latent size.
    return math.prod(_TINY[3:])


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_lowered_programs_convolve_bf16_channels_first_in_3d(wan_bf16, platform):
    text = wan_bf16.lower_decode(_TINY, platform=platform).as_text()
    convs = hlo.convolutions(text)
    assert len(convs) >= 20
    dtypes = {(c.input_dtype, c.output_dtype) for c in convs}
    assert dtypes == {("bf16", "bf16")}, dtypes
    # The resamplers' and the attention's convolutions 3-D too: no 2-D island of another layout.
    assert all(len(c.input_shape) == 5 and not c.channels_last for c in convs)
    # No activation-sized fp32 value stored: statistics and softmax inside fusible chains only.
    # (one scan step's output, 4 frames of the tiny decoder's 3 channels, is an activation of that size)
    found = escapes.fp32_escapes(text, min_elements=_TINY[0] * 3 * 4 * 64 * 128)
    assert not found, "\n".join(found[:5])


def test_h200_program_runs_every_convolution_ncdhw_with_no_activation_moved(wan_bf16):
    require_compiler("cuda")
    text = wan_bf16.compile_decode(_TINY, target="h200").as_text()
    convs, moves = hlo.compiled_ops(text)
    assert len(convs) >= 60 and all(c.op == "cudnn-conv" for c in convs)
    # Upstream's 2-D resampler and attention convolutions are NHWC here (10 of 64, and 9 activations
    # transposed to and from them); with wan_resample_conv3d and wan_attention_block, none.
    assert {c.dim_labels for c in convs} == {"bf012_oi012->bf012"}
    assert {c.dtype for c in convs} == {"bf16"}
    assert [m for m in moves if m.moves_data_to_another_layout and m.elements >= _smallest_activation()] == []
    assert max(c.elements for c in convs) < 2**31


def test_h200_program_writes_each_padded_conv_input_once(wan_bf16):
    # wan_padded_cache: the norm and SiLU write each causal conv's cache-padded input; without it
    # they write the input, which the scan's steps then copy behind its cache (here, jax 0.10.2, 155136 bytes
    # of concatenation and 97288 of copies against 53760 and 8; Wan 2.1 480p 138 -> 39 GiB of data
    # movement per decode, docs/results/h200-padded-inputs-2026-11-29.md).
    require_compiler("cuda")
    off = ct.wrap(ct.random_upstream("wan-tiny", seed=0), mesh="dp=1,tp=1",
                  options=ct.RuntimeOptions(dtype="bfloat16", wan_padded_cache=False))
    on_loops, off_loops = (
        hlo.executed_summary(vae.compile_decode(_TINY, target="h200").as_text())["movement_bytes_in_loops_by_op"]
        for vae in (wan_bf16, off)
    )
    joins = {name: loops.get("concatenate", 0) + loops.get("copy", 0) for name, loops in
             (("on", on_loops), ("off", off_loops))}
    assert joins["on"] <= joins["off"] / 4, joins
    assert on_loops.get("copy", 0) < 2 * _smallest_activation()  # no activation copied in a step


def test_h200_program_without_the_layout_patches_moves_activations():
    # What the two patches remove, so that the test above cannot pass by accident.
    require_compiler("cuda")
    off = ct.RuntimeOptions(dtype="bfloat16", wan_resample_conv3d=False, wan_attention_block=False)
    vae = ct.wrap(ct.random_upstream("wan-tiny", seed=0), mesh="dp=1,tp=1", options=off)
    convs, moves = hlo.compiled_ops(vae.compile_decode(_TINY, target="h200").as_text())
    assert "b01f_o01i->b01f" in {c.dim_labels for c in convs}
    assert [m for m in moves if m.moves_data_to_another_layout and m.elements >= _smallest_activation()]


def test_v6e_program_compiles_with_bf16_convolutions(wan_bf16):
    require_compiler("tpu")
    # About 30 s on 2 quiet cores: the TPU compiler is slow.
    compiled = wan_bf16.compile_decode(_TINY, target="v6e-1")
    convs, _ = hlo.compiled_ops(compiled.as_text())
    assert len(convs) >= 60
    # Every spatial convolution of an activation is bf16. The TPU compiler writes the attention's two
    # products (logits, weights x values; fp32 by design) as 2-D convolutions: the middle block runs
    # twice (the first latent frame, the scan body).
    spatial = [c for c in convs if len(c.shape) >= 4 and c.elements >= _smallest_activation()]
    assert {c.dtype for c in spatial} == {"bf16"}
    assert sorted(len(c.shape) for c in convs if c.dtype != "bf16") == [2, 2, 2, 2]
    assert compiled.memory_analysis().temp_size_in_bytes > 0
    plan = wan_bf16.plan_for("tpu")
    assert {"wan_norm_input", "wan_frame_scan", "wan_resample_conv3d", "wan_attention_block"} <= set(plan.steps)
