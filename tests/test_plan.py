"""The run plan: what runs on each target, and switches that cannot apply refused with the reason."""

import json

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.platforms.run_plan import GPU_MAX_CONV_ELEMENTS, TPU_MAX_CONV_ELEMENTS, Target, build_plan

_CPU_FP32 = (
    "group_norm",
    "silu",
    "conv_bias",
    "chunk_free_conv",
    "nearest_upsample",
    "trim_conv_cache",
    "cache_first",
    "time_tap_conv",
    "low_res_spatial_norm",
    "frame_scan",
    "tile_batching",
)


def test_cpu_fp32_one_device_runs_every_cpu_patch():
    plan = build_plan(ct.RuntimeOptions(), Target("cpu", "float32"))
    assert plan.steps == _CPU_FP32
    assert dict(plan.skipped) == {
        "resample_conv3d": "measured on CUDA and TPU only (their compilers' layouts and memory)",
        "shard_activations": "a one-device mesh has nothing to shard",
        "time_chunks": "measured on CUDA only (compiled for an H200)",
    }
    assert plan.conv.channels_last and plan.conv.bias_in_fp32 and plan.conv.max_elements is None


def test_tpu_bf16_tp8():
    plan = build_plan(ct.RuntimeOptions(dtype="bf16"), Target("tpu", "bfloat16", dp=1, tp=8))
    assert "time_tap_conv" not in plan.steps and "low_res_spatial_norm" not in plan.steps
    assert "shard_activations" in plan.steps and "frame_scan" in plan.steps
    skipped = dict(plan.skipped)
    assert "XLA:CPU" in skipped["time_tap_conv"] and "tp > 1" in skipped["low_res_spatial_norm"]
    # bf16 out of every convolution; layout left to XLA's TPU layout assignment;
    # split above 2^31 elements per device (width over tp devices).
    assert not plan.conv.bias_in_fp32 and not plan.conv.channels_last
    assert plan.conv.max_elements == 8 * TPU_MAX_CONV_ELEMENTS == 8 * (2**31 - 1)


@pytest.mark.parametrize("platform", ["cuda", "gpu", "rocm"])
def test_gpu_bf16(platform):
    plan = build_plan(ct.RuntimeOptions(dtype="bf16"), Target(platform, "bfloat16"))
    assert plan.target.platform in ("cuda", "rocm")
    # CUDA: channels-first, the NCDHW the compiler keeps, and 3-D upsampler
    # convs (no 2-D layout island); ROCm was never compiled: as before.
    cuda = plan.target.platform == "cuda"
    assert plan.conv.channels_last != cuda and ("resample_conv3d" in plan.steps) == cuda
    # CUDA: the bias in cuDNN's fp32 epilogue (the compiler fuses it); ROCm: after rounding.
    assert plan.conv.bias_in_fp32 == plan.conv.fused_bias == cuda
    assert plan.conv.max_elements == GPU_MAX_CONV_ELEMENTS == 2**31 - 1
    assert "time_tap_conv" not in plan.steps and "low_res_spatial_norm" in plan.steps
    # CUDA: the decoder's resnet blocks convolve in time chunks (compiled temp, H200).
    assert ("time_chunks" in plan.steps) == cuda


def test_cpu_bf16_keeps_the_fp32_bias_and_skips_time_taps():
    plan = build_plan(ct.RuntimeOptions(dtype="bf16"), Target("cpu", "bfloat16"))
    assert plan.conv.bias_in_fp32
    assert "activation-sized fp32" in dict(plan.skipped)["time_tap_conv"]


@pytest.mark.parametrize("platform", ["cpu", "cuda", "rocm", "tpu"])
def test_fp16_is_planned_as_bf16_with_the_bias_in_fp32_everywhere(platform):
    fp16 = build_plan(ct.RuntimeOptions(dtype="fp16"), Target(platform, "float16"))
    bf16 = build_plan(ct.RuntimeOptions(dtype="bf16"), Target(platform, "bfloat16"))
    assert fp16.target.dtype == "float16" and fp16.steps == bf16.steps
    assert dict(fp16.skipped).keys() == dict(bf16.skipped).keys()
    # The bias goes into the fp32 accumulator on every platform (on TPU and
    # ROCm unlike bf16); CUDA writes it as cuDNN's fused epilogue.
    assert fp16.conv.bias_in_fp32 and fp16.conv.fused_bias == (platform == "cuda")
    assert (fp16.conv.channels_last, fp16.conv.max_elements) == (bf16.conv.channels_last, bf16.conv.max_elements)
    assert "fp32 accumulator" in str(fp16) and fp16.as_dict()["target"]["dtype"] == "float16"
    if platform == "cpu":
        assert "fp16" in dict(fp16.skipped)["time_tap_conv"]


def test_gpu_without_the_conv_kernel_keeps_upstreams_chunking():
    plan = build_plan(ct.RuntimeOptions(conv_bias=False), Target("cuda", "float32"))
    assert "chunk_free_conv" not in plan.steps and plan.conv is None
    assert "2^31" in dict(plan.skipped)["chunk_free_conv"]
    assert "chunk_free_conv" in build_plan(ct.RuntimeOptions(conv_bias=False), Target("tpu", "float32")).steps


def test_switched_off_is_neither_applied_nor_skipped():
    plan = build_plan(ct.RuntimeOptions(frame_scan=False, time_tap_conv=False), Target("cpu", "float32"))
    assert "frame_scan" not in plan.steps and "time_tap_conv" not in plan.steps
    assert "frame_scan" not in dict(plan.skipped)


def test_requirements_follow_what_is_off():
    plan = build_plan(ct.RuntimeOptions(trim_conv_cache=False), Target("cpu", "float32"))
    assert "frame_scan" not in plan.steps
    assert dict(plan.skipped)["frame_scan"] == "needs trim_conv_cache"


@pytest.mark.parametrize(
    ("options", "target", "why"),
    [
        (ct.RuntimeOptions(time_tap_conv=True), Target("cuda", "float32"), "XLA:CPU"),
        (ct.RuntimeOptions(dtype="bf16", time_tap_conv=True), Target("cpu", "bfloat16"), "bf16"),
        (ct.RuntimeOptions(dtype="fp16", time_tap_conv=True), Target("cpu", "float16"), "fp16"),
        (ct.RuntimeOptions(low_res_spatial_norm=True), Target("cpu", "float32", tp=4), "tp > 1"),
        (ct.RuntimeOptions(shard_activations=True), Target("cpu", "float32"), "one-device"),
        (ct.RuntimeOptions(resample_conv3d=True), Target("rocm", "bfloat16"), "CUDA and TPU only"),
        (ct.RuntimeOptions(resample_conv3d=True, conv_bias=False), Target("cuda", "bfloat16"), "needs conv_bias"),
    ],
)
def test_a_switch_set_true_that_cannot_apply_says_why(options, target, why):
    with pytest.raises(ValueError, match="cannot apply") as err:
        build_plan(options, target)
    assert why in str(err.value)


def test_wrap_refuses_and_lowering_for_another_platform_refuses_too(tiny_upstream):
    with pytest.raises(ValueError, match="time_tap_conv=True cannot apply on cpu bfloat16"):
        ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1", options=ct.RuntimeOptions(dtype="bf16", time_tap_conv=True))
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(time_tap_conv=True))
    assert vae.plan.applies("time_tap_conv")
    with pytest.raises(ValueError, match="cannot apply on cuda"):
        vae.lower_decode((1, 4, 2, 2, 2), platform="cuda")


def test_options_validate_their_types():
    with pytest.raises(TypeError, match="frame_scan"):
        ct.RuntimeOptions(frame_scan=1)
    with pytest.raises(ValueError, match="conv_split_elements"):
        ct.RuntimeOptions(conv_split_elements=0)
    with pytest.raises(ValueError, match="needs conv_bias"):
        ct.RuntimeOptions(conv_split_elements=100, conv_bias=False)
    with pytest.raises(ValueError, match="needs cache_first"):
        ct.RuntimeOptions(time_tap_conv=True, cache_first=False)


def test_the_plan_is_visible_in_repr_and_json(tiny_vae):
    text = repr(tiny_vae)
    assert "plan=cpu float32 dp=1,tp=1: group_norm" in text and "time taps" in text
    described = json.loads(json.dumps(tiny_vae.plan.as_dict()))
    assert described["target"] == {"platform": "cpu", "dtype": "float32", "dp": 1, "tp": 1}
    assert described["steps"] == list(_CPU_FP32)
    assert described["conv"] == {"layout": "channels-last, time taps", "bias": "fp32 accumulator", "max_elements": None}
    cuda = tiny_vae.plan_for("cuda").as_dict()
    assert cuda["conv"]["max_elements"] == 2**31 - 1 and "time_tap_conv" in cuda["skipped"]
    with pytest.raises(ValueError, match="platform must be one of"):
        tiny_vae.plan_for("metal")


def test_every_switch_has_one_registered_patch_and_the_plan_reads_only_the_registry():
    from cogvideox_torchax.patches.registry import patches
    from cogvideox_torchax.platforms.run_plan import compiler_options

    registered = [p.option for p in patches()]
    # Every field is a registered patch's switch (a patch needs no field: the next test).
    assert set(ct.RuntimeOptions.switches()) <= set(registered) and len(set(registered)) == len(registered)
    # conv_bias before chunk_free_conv (its condition reads it); sharding last (mixins change exact classes).
    assert registered.index("conv_bias") < registered.index("chunk_free_conv")
    assert registered.index("trim_conv_cache") < registered.index("frame_scan")
    assert registered[-1] == "shard_activations"
    cpu = build_plan(ct.RuntimeOptions(), Target("cpu", "float32"))
    assert list(cpu.steps) == [o for o in registered if cpu.applies(o)]
    # A patch's compiler options come with it: XLA:CPU keeps cache_first's barriers only when told.
    assert compiler_options(cpu) == {"xla_disable_hlo_passes": "cse_barrier_expander"}
    assert compiler_options(build_plan(ct.RuntimeOptions(cache_first=False), Target("cpu", "float32"))) is None
    assert compiler_options(build_plan(ct.RuntimeOptions(), Target("cuda", "bfloat16"))) is None


def test_a_patch_without_a_field_is_switched_by_name(monkeypatch):
    """Adding a patch touches its module only: its switch works by name, with the plan's rules."""
    from cogvideox_torchax.patches import registry
    from cogvideox_torchax.patches.base import Patch
    from cogvideox_torchax.platforms import run_plan as plan_module

    demo = Patch("demo_patch", 999, None, lambda target, applied: None if target.platform == "cpu" else "CPU only")
    every = (*registry.patches(), demo)
    monkeypatch.setattr(registry, "patches", lambda: every)
    monkeypatch.setattr(plan_module, "patches", lambda: every)
    cpu, cuda = Target("cpu", "float32"), Target("cuda", "bfloat16")

    assert build_plan(ct.RuntimeOptions(), cpu).steps[-1] == "demo_patch"
    assert dict(build_plan(ct.RuntimeOptions(), cuda).skipped)["demo_patch"] == "CPU only"
    off = ct.RuntimeOptions(patches={"demo_patch": False})
    assert off.switch("demo_patch") is False and "demo_patch" not in build_plan(off, cpu).steps
    assert "demo_patch" not in dict(build_plan(off, cuda).skipped)
    on = ct.RuntimeOptions(patches={"demo_patch": True})
    with pytest.raises(ValueError, match="demo_patch=True cannot apply on cuda bfloat16 dp=1,tp=1: CPU only"):
        build_plan(on, cuda)
    assert hash(on) != hash(off) and on == ct.RuntimeOptions(patches=(("demo_patch", True),))
    assert ct.RuntimeOptions(patches={"demo_patch": None}) == ct.RuntimeOptions()

    with pytest.raises(ValueError, match="no registered patch answers to 'demo_typo'; known: cache_first"):
        ct.RuntimeOptions(patches={"demo_typo": True})
    with pytest.raises(ValueError, match="'frame_scan' has a field of its own"):
        ct.RuntimeOptions(patches={"frame_scan": False})
    with pytest.raises(TypeError, match=r"patches\['demo_patch'\] must be None, True or False"):
        ct.RuntimeOptions(patches={"demo_patch": "yes"})
    with pytest.raises(TypeError, match="patches must map switch names"):
        ct.RuntimeOptions(patches=["demo_patch"])
