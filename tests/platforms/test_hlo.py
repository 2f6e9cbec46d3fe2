"""`platforms.hlo`: what a compiled program runs per call, its loops unrolled, checked on programs of known count."""

import jax
import jax.numpy as jnp

from cogvideox_torchax.platforms import hlo

# A GPU program's shape in XLA's text: a cuDNN convolution and a pad fusion inside a
# loop of 30 trips, a dynamic-update-slice writing a 64-element update into a larger
# buffer, one more convolution outside the loop, and a fusion that is not data movement.
_PROGRAM = """HloModule jit_run

%fused_pad (param_0: bf16[1,8,10,10]) -> bf16[1,8,12,12] {
  %param_0 = bf16[1,8,10,10]{3,2,1,0} parameter(0)
  %constant_1 = bf16[] constant(0)
  ROOT %pad.1 = bf16[1,8,12,12]{3,2,1,0} pad(bf16[1,8,10,10]{3,2,1,0} %param_0, bf16[] %constant_1), padding=0_0x0_0x1_1x1_1
}

%fused_add (param_0.1: bf16[1,8,10,10], param_1.1: bf16[1,8,10,10]) -> bf16[1,8,10,10] {
  %param_0.1 = bf16[1,8,10,10]{3,2,1,0} parameter(0)
  %param_1.1 = bf16[1,8,10,10]{3,2,1,0} parameter(1)
  ROOT %add.2 = bf16[1,8,10,10]{3,2,1,0} add(bf16[1,8,10,10]{3,2,1,0} %param_0.1, bf16[1,8,10,10]{3,2,1,0} %param_1.1)
}

%body (p: (s32[], bf16[1,8,10,10])) -> (s32[], bf16[1,8,10,10]) {
  %p = (s32[], bf16[1,8,10,10]{3,2,1,0}) parameter(0)
  %x = bf16[1,8,10,10]{3,2,1,0} get-tuple-element((s32[], bf16[1,8,10,10]{3,2,1,0}) %p), index=1
  %padded = bf16[1,8,12,12]{3,2,1,0} fusion(bf16[1,8,10,10]{3,2,1,0} %x), kind=kLoop, calls=%fused_pad
  %conv = (bf16[1,8,10,10]{3,2,1,0}, u8[0]{0}) custom-call(bf16[1,8,12,12]{3,2,1,0} %padded), custom_call_target="__cudnn$convForward"
  %y = bf16[1,8,10,10]{3,2,1,0} get-tuple-element((bf16[1,8,10,10]{3,2,1,0}, u8[0]{0}) %conv), index=0
  %sum = bf16[1,8,10,10]{3,2,1,0} fusion(bf16[1,8,10,10]{3,2,1,0} %x, bf16[1,8,10,10]{3,2,1,0} %y), kind=kLoop, calls=%fused_add
  %i = s32[] get-tuple-element((s32[], bf16[1,8,10,10]{3,2,1,0}) %p), index=0
  ROOT %t = (s32[], bf16[1,8,10,10]{3,2,1,0}) tuple(s32[] %i, bf16[1,8,10,10]{3,2,1,0} %sum)
}

%cond (q: (s32[], bf16[1,8,10,10])) -> pred[] {
  %q = (s32[], bf16[1,8,10,10]{3,2,1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: bf16[1,8,10,10], u: f32[64]) -> bf16[1,8,10,10] {
  %a = bf16[1,8,10,10]{3,2,1,0} parameter(0)
  %u = f32[64]{0} parameter(1)
  %zero = s32[] constant(0)
  %buffer = f32[4096]{0} broadcast(f32[] %zero), dimensions={}
  %written = f32[4096]{0} dynamic-update-slice(f32[4096]{0} %buffer, f32[64]{0} %u, s32[] %zero)
  %first = (bf16[1,8,10,10]{3,2,1,0}, u8[0]{0}) custom-call(bf16[1,8,10,10]{3,2,1,0} %a), custom_call_target="__cudnn$convForward"
  %f = bf16[1,8,10,10]{3,2,1,0} get-tuple-element((bf16[1,8,10,10]{3,2,1,0}, u8[0]{0}) %first), index=0
  %init = (s32[], bf16[1,8,10,10]{3,2,1,0}) tuple(s32[] %zero, bf16[1,8,10,10]{3,2,1,0} %f)
  %loop = (s32[], bf16[1,8,10,10]{3,2,1,0}) while((s32[], bf16[1,8,10,10]{3,2,1,0}) %init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"30"}}
  ROOT %out = bf16[1,8,10,10]{3,2,1,0} get-tuple-element((s32[], bf16[1,8,10,10]{3,2,1,0}) %loop), index=1
}
"""


def test_runs_follow_the_loop_s_trip_count():
    runs = hlo.runs_per_call(_PROGRAM)
    assert runs["main"] == 1
    assert runs["body"] == runs["fused_pad"] == runs["fused_add"] == 30
    assert runs["cond"] == 31


def test_convolution_calls_and_bytes_moved_per_call():
    executed = hlo.executed_summary(_PROGRAM)
    assert executed["convolution_calls"] == 1 + 30
    # 30 pads of 1x8x12x12 bf16, and the update's 64 fp32 (not the 4096-element buffer
    # it is written into in place); the add fusion is not data movement.
    assert executed["movement_bytes_by_op"] == {"pad": 30 * 8 * 12 * 12 * 2, "dynamic-update-slice": 64 * 4}
    assert executed["movement_bytes"] == sum(executed["movement_bytes_by_op"].values())
    # Of it, the loop body's: the pads (the update is written outside the loop).
    assert executed["movement_bytes_in_loops_by_op"] == {"pad": 30 * 8 * 12 * 12 * 2}


def test_a_loop_of_unknown_count_is_said_unknown():
    unknown = _PROGRAM.replace(', backend_config={"known_trip_count":{"n":"30"}}', "")
    assert hlo.runs_per_call(unknown)["body"] is None
    executed = hlo.executed_summary(unknown)
    assert executed["convolution_calls"] is None and executed["movement_bytes"] is None


def test_a_cpu_program_s_loop_counts_as_its_iterations():
    def seven_convolutions(x, w):
        def step(_, c):
            return jnp.tanh(jax.lax.conv_general_dilated(c, w, (1, 1), "SAME")) + c

        return jax.lax.fori_loop(0, 7, step, x)

    text = jax.jit(seven_convolutions).lower(jnp.ones((1, 4, 16, 16)), jnp.ones((4, 4, 3, 3))).compile().as_text()
    # One convolution in the text, run seven times (seven in the text where a compiler unrolls the loop).
    assert len(hlo.compiled_ops(text)[0]) in (1, 7)
    assert hlo.executed_summary(text)["convolution_calls"] == 7


def test_tpu_tuple_results_with_tiled_layouts_are_read():
    # An async collective's result is a tuple whose TPU layouts hold parentheses (tiles,
    # memory space): a halo exchange of a width-split convolution at tp=8.
    line = (
        "  %collective-permute-start = (bf16[1,128,18,24,5]{1,3,4,2,0:T(8,128)(2,1)S(1)}, "
        "bf16[1,128,18,24,5]{1,3,4,2,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}, u32[]{:S(2)}) "
        "collective-permute-start(bf16[1,128,18,24,5]{1,3,4,2,0:T(8,128)(2,1)S(1)} %copy.1), channel_id=1, "
        "source_target_pairs={{1,0},{2,1}}"
    )
    program = f"HloModule m\n\nENTRY %main (a: bf16[1,128,18,24,5]) -> bf16[1] {{\n{line}\n}}\n"
    assert hlo.compiled_summary(program)["collectives"] == {"collective-permute": 1}


def test_a_dynamic_slice_whose_offset_is_computed_in_its_fusion_is_data_movement():
    # XLA clamps a dynamic slice's start inside the fusion (scalar compare, add, select):
    # the fusion still only moves data, 1x8x2x10x10 bf16 here.
    program = """HloModule m

%fused_dynamic_slice (param_0: bf16[1,8,10,10,10], param_1: s32[]) -> bf16[1,8,2,10,10] {
  %param_0 = bf16[1,8,10,10,10]{4,3,2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %lt = pred[] compare(s32[] %param_1, s32[] %zero), direction=LT
  %ten = s32[] constant(10)
  %wrapped = s32[] add(s32[] %param_1, s32[] %ten)
  %start = s32[] select(pred[] %lt, s32[] %wrapped, s32[] %param_1)
  ROOT %ds = bf16[1,8,2,10,10]{4,3,2,1,0} dynamic-slice(bf16[1,8,10,10,10]{4,3,2,1,0} %param_0, s32[] %zero, s32[] %zero, s32[] %start, s32[] %zero, s32[] %zero), dynamic_slice_sizes={1,8,2,10,10}
}

ENTRY %main (a: bf16[1,8,10,10,10], i: s32[]) -> bf16[1,8,2,10,10] {
  %a = bf16[1,8,10,10,10]{4,3,2,1,0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %cut = bf16[1,8,2,10,10]{4,3,2,1,0} fusion(bf16[1,8,10,10,10]{4,3,2,1,0} %a, s32[] %i), kind=kLoop, calls=%fused_dynamic_slice
}
"""  # noqa: E501
    executed = hlo.executed_summary(program)
    assert executed["movement_bytes_by_op"] == {"dynamic-slice": 8 * 2 * 10 * 10 * 2}
    assert executed["movement_bytes_in_loops_by_op"] == {}
