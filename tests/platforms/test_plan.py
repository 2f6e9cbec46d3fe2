"""The run plan: what runs on each target, and switches that cannot apply refused with the reason."""

import json

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.platforms.build import build_plan, compiler_options
from cogvideox_torchax.platforms.profiles import MAX_CONV_ELEMENTS
from cogvideox_torchax.platforms.run_plan import Placement

_CPU_FP32 = (
    "conv_bias",
    "chunk_free_conv",
    "group_norm",
    "nearest_upsample",
    "silu",
    "low_res_spatial_norm",
    "trim_conv_cache",
    "cache_first",
    "time_tap_conv",
    "frame_scan",
    "tile_batching",
)

def test_cpu_fp32_one_device_runs_every_cpu_patch():
    plan = build_plan(ct.RuntimeOptions(), Placement("cpu", "float32"))
    assert plan.steps == _CPU_FP32
    assert dict(plan.skipped) == {
        "padded_cache": "measured on CUDA only (compiled for an H200)",
        "resample_conv3d": "measured on CUDA and TPU only (their compilers' layouts and memory)",
        "shard_activations": "a one-device mesh has nothing to shard",
        "time_chunks": "measured on CUDA only (compiled for an H200)",
    }
    assert plan.conv.channels_last and plan.conv.bias_in_fp32 and plan.conv.max_elements is None


def test_tpu_bf16_tp8():
    plan = build_plan(ct.RuntimeOptions(dtype="bf16"), Placement("tpu", "bfloat16", dp=1, tp=8))
    assert "time_tap_conv" not in plan.steps and "low_res_spatial_norm" not in plan.steps
    assert "shard_activations" in plan.steps and "frame_scan" in plan.steps
    skipped = dict(plan.skipped)
    assert "XLA:CPU" in skipped["time_tap_conv"] and "tp > 1" in skipped["low_res_spatial_norm"]
    # bf16 out of every convolution; layout left to XLA's TPU layout assignment;
    # split above 2^31 elements per device (width over tp devices).
    assert not plan.conv.bias_in_fp32 and not plan.conv.channels_last
    assert plan.conv.max_elements == 8 * MAX_CONV_ELEMENTS == 8 * (2**31 - 1)


@pytest.mark.parametrize("platform", ["cuda", "gpu", "rocm"])
def test_gpu_bf16(platform):
    plan = build_plan(ct.RuntimeOptions(dtype="bf16"), Placement(platform, "bfloat16"))
    assert plan.placement.platform in ("cuda", "rocm")
    # CUDA: channels-first, the NCDHW the compiler keeps, and 3-D upsampler
    # convs (no 2-D layout island); ROCm was never compiled: as before.
    cuda = plan.placement.platform == "cuda"
    assert plan.conv.channels_last != cuda and ("resample_conv3d" in plan.steps) == cuda
    # CUDA: the bias in cuDNN's fp32 epilogue (the compiler fuses it); ROCm: after rounding.
    assert plan.conv.bias_in_fp32 == plan.conv.fused_bias == cuda
    assert plan.conv.max_elements == MAX_CONV_ELEMENTS == 2**31 - 1
    assert "time_tap_conv" not in plan.steps and "low_res_spatial_norm" in plan.steps
    # CUDA: the decoder's resnet blocks convolve in time chunks (compiled temp, H200).
    assert ("time_chunks" in plan.steps) == cuda
    # CUDA: XLA:GPU's latency-hiding scheduler off, as jax 0.10.2 had it (jax 0.12's makes the H200 program larger).
    options = compiler_options(plan) or {}
    assert (options.get("xla_gpu_enable_latency_hiding_scheduler") is False) == cuda


def test_cpu_bf16_keeps_the_fp32_bias_and_skips_time_taps():
    plan = build_plan(ct.RuntimeOptions(dtype="bf16"), Placement("cpu", "bfloat16"))
    assert plan.conv.bias_in_fp32
    assert "activation-sized fp32" in dict(plan.skipped)["time_tap_conv"]


@pytest.mark.parametrize("platform", ["cpu", "cuda", "rocm", "tpu"])
def test_fp16_is_planned_as_bf16_with_the_bias_in_fp32_everywhere(platform):
    fp16 = build_plan(ct.RuntimeOptions(dtype="fp16"), Placement(platform, "float16"))
    bf16 = build_plan(ct.RuntimeOptions(dtype="bf16"), Placement(platform, "bfloat16"))
    assert fp16.placement.dtype == "float16" and fp16.steps == bf16.steps
    assert dict(fp16.skipped).keys() == dict(bf16.skipped).keys()
    # The bias goes into the fp32 accumulator on every platform (on TPU and
    # ROCm unlike bf16); CUDA writes it as cuDNN's fused epilogue.
    assert fp16.conv.bias_in_fp32 and fp16.conv.fused_bias == (platform == "cuda")
    assert (fp16.conv.channels_last, fp16.conv.max_elements) == (bf16.conv.channels_last, bf16.conv.max_elements)
    assert "fp32 accumulator" in str(fp16) and fp16.as_dict()["target"]["dtype"] == "float16"
    if platform == "cpu":
        assert "fp16" in dict(fp16.skipped)["time_tap_conv"]


def test_gpu_without_the_conv_kernel_keeps_upstreams_chunking():
    plan = build_plan(ct.RuntimeOptions(conv_bias=False), Placement("cuda", "float32"))
    assert "chunk_free_conv" not in plan.steps and plan.conv is None
    assert "2^31" in dict(plan.skipped)["chunk_free_conv"]
    assert "chunk_free_conv" in build_plan(ct.RuntimeOptions(conv_bias=False), Placement("tpu", "float32")).steps


def test_switched_off_is_neither_applied_nor_skipped():
    plan = build_plan(ct.RuntimeOptions(frame_scan=False, time_tap_conv=False), Placement("cpu", "float32"))
    assert "frame_scan" not in plan.steps and "time_tap_conv" not in plan.steps
    assert "frame_scan" not in dict(plan.skipped)


def test_requirements_follow_what_is_off():
    plan = build_plan(ct.RuntimeOptions(trim_conv_cache=False), Placement("cpu", "float32"))
    assert "frame_scan" not in plan.steps
    assert dict(plan.skipped)["frame_scan"] == "needs trim_conv_cache"


@pytest.mark.parametrize(
    ("options", "target", "why"),
    [
        (ct.RuntimeOptions(time_tap_conv=True), Placement("cuda", "float32"), "XLA:CPU"),
        (ct.RuntimeOptions(dtype="bf16", time_tap_conv=True), Placement("cpu", "bfloat16"), "bf16"),
        (ct.RuntimeOptions(dtype="fp16", time_tap_conv=True), Placement("cpu", "float16"), "fp16"),
        (ct.RuntimeOptions(low_res_spatial_norm=True), Placement("cpu", "float32", tp=4), "tp > 1"),
        (ct.RuntimeOptions(shard_activations=True), Placement("cpu", "float32"), "one-device"),
        (ct.RuntimeOptions(resample_conv3d=True), Placement("rocm", "bfloat16"), "CUDA and TPU only"),
        (ct.RuntimeOptions(resample_conv3d=True, conv_split_elements=2**20), Placement("cpu", "float32"),
         "measured on CUDA and TPU only"),
    ],
)
def test_a_switch_set_true_that_cannot_apply_says_why(options, target, why):
    with pytest.raises(ValueError, match="cannot apply") as err:
        build_plan(options, target)
    assert why in str(err.value)


def test_wrap_refuses_and_lowering_for_another_platform_refuses_too(tiny_upstream):
    with pytest.raises(ValueError, match="time_tap_conv=True cannot apply on cpu bfloat16"):
        ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1",
                options=ct.RuntimeOptions(dtype="bf16", time_tap_conv=True))
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(time_tap_conv=True))
    assert vae.plan.applies("time_tap_conv")
    with pytest.raises(ValueError, match="cannot apply on cuda"):
        vae.lower_decode((1, 4, 2, 2, 2), platform="cuda")


def test_a_switch_set_true_whose_requirement_is_set_false_is_refused_at_once():
    # Every patch's ``requires`` is checked on construction, before any plan.
    with pytest.raises(ValueError, match="resample_conv3d=True needs conv_bias"):
        ct.RuntimeOptions(resample_conv3d=True, conv_bias=False)


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
    assert "plan=cpu float32 dp=1,tp=1: conv_bias" in text and "time taps" in text
    described = json.loads(json.dumps(tiny_vae.plan.as_dict()))
    assert described["target"] == {"platform": "cpu", "dtype": "float32", "dp": 1, "tp": 1}
    assert described["steps"] == list(_CPU_FP32)
    assert described["conv"] == {"layout": "channels-last, time taps", "bias": "fp32 accumulator", "max_elements": None}
    cuda = tiny_vae.plan_for("cuda").as_dict()
    assert cuda["conv"]["max_elements"] == 2**31 - 1 and "time_tap_conv" in cuda["skipped"]
    with pytest.raises(ValueError, match="platform must be one of"):
        tiny_vae.plan_for("metal")


def test_every_switch_is_a_registered_patch_in_the_declared_order():
    from cogvideox_torchax.patches.base import STAGES
    from cogvideox_torchax.patches.registry import patches
    from cogvideox_torchax.platforms.build import compiler_options

    registered = [p.switch for p in patches()]
    assert ct.RuntimeOptions.switches() == tuple(registered) and len(set(registered)) == len(registered)
    # Stages in order; within one, what a patch requires or follows comes first.
    stages = [STAGES.index(p.stage) for p in patches()]
    assert stages == sorted(stages)
    for i, p in enumerate(patches()):
        assert all(registered.index(n) < i for n in (*p.requires, *p.after) if n in registered), p.switch
    assert registered.index("conv_bias") < registered.index("chunk_free_conv")
    assert registered[-1] == "shard_activations"
    cpu = build_plan(ct.RuntimeOptions(), Placement("cpu", "float32"))
    assert list(cpu.steps) == [o for o in registered if cpu.applies(o)]
    # A patch's compiler options come with it: XLA:CPU keeps cache_first's barriers only when told.
    assert compiler_options(cpu) == {"xla_disable_hlo_passes": "cse_barrier_expander"}
    assert compiler_options(build_plan(ct.RuntimeOptions(cache_first=False), Placement("cpu", "float32"))) is None
    # CUDA: no patch options, only the platform's own (its scheduler as jax 0.10.2 had it).
    assert compiler_options(build_plan(ct.RuntimeOptions(), Placement("cuda", "bfloat16"))) == {
        "xla_gpu_enable_latency_hiding_scheduler": False
    }


_DEMO_PATCH = """
from cogvideox_torchax.patches.base import Patch

PATCHES = (
    Patch(
        "demo_patch", "layers", "Demo: marks the module.",
        lambda module, plan, mesh: None,
        requires=("cache_first",),
        why_not=lambda placement, applied: None if placement.platform == "cpu" else "CPU only",
        families=("cogvideox",),
    ),
)
"""


def test_a_patch_module_added_to_the_package_is_switched_ordered_and_documented(tmp_path, monkeypatch):
    """Adding a patch is one module in its family's package.

    No other file names it, yet options, plan, order and docs know it.
    """
    import sys

    import cogvideox_torchax.families.cogvideox.patches as package
    from cogvideox_torchax.patches import registry

    (tmp_path / "demo_patch.py").write_text(_DEMO_PATCH)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    registry.patches.cache_clear()
    try:
        order = registry.switches()
        # Its stage and requirement place it: after cache_first, before the blocks' time_chunks.
        assert order.index("cache_first") < order.index("demo_patch") < order.index("time_chunks")
        cpu, cuda = Placement("cpu", "float32"), Placement("cuda", "bfloat16")
        assert "demo_patch" in build_plan(ct.RuntimeOptions(), cpu).steps
        assert dict(build_plan(ct.RuntimeOptions(), cuda).skipped)["demo_patch"] == "CPU only"
        off = ct.RuntimeOptions(demo_patch=False)
        assert off.demo_patch is False and "demo_patch" not in build_plan(off, cpu).steps
        assert ct.RuntimeOptions(patches={"demo_patch": False}) == off  # the older spelling
        with pytest.raises(ValueError, match="demo_patch=True cannot apply on cuda bfloat16 dp=1,tp=1: CPU only"):
            build_plan(ct.RuntimeOptions(demo_patch=True), cuda)
        with pytest.raises(ValueError, match="demo_patch=True needs cache_first"):
            ct.RuntimeOptions(demo_patch=True, cache_first=False)
        assert "needs cache_first" in dict(build_plan(ct.RuntimeOptions(cache_first=False), cpu).skipped)["demo_patch"]
        assert "| `demo_patch` | layers | `cache_first` | CogVideoX only: Demo: marks the module. |" in (
            registry.switches_markdown())
        assert "demo_patch" not in {p.switch for p in registry.patches_for("wan")}
    finally:
        registry.patches.cache_clear()
        sys.modules.pop("cogvideox_torchax.families.cogvideox.patches.demo_patch", None)


def test_switches_are_keywords_and_typos_stay_errors():
    on = ct.RuntimeOptions(dtype="bf16", frame_scan=False, group_norm=True)
    assert on.frame_scan is False and on.group_norm is True and on.silu is None and on.dtype == "bfloat16"
    assert on.switched == (("frame_scan", False), ("group_norm", True)) and on.patches == on.switched
    assert on == ct.RuntimeOptions("bfloat16", group_norm=True, frame_scan=False, silu=None)
    assert hash(on) == hash(ct.RuntimeOptions("bfloat16", patches={"group_norm": True, "frame_scan": False}))
    import dataclasses

    assert dataclasses.replace(on, dtype="float32") == ct.RuntimeOptions(frame_scan=False, group_norm=True)
    with pytest.raises(TypeError, match="unknown switches 'fram_scan'; known: cache_first"):
        ct.RuntimeOptions(fram_scan=False)
    with pytest.raises(ValueError, match="no registered patch answers to 'demo_typo'"):
        ct.RuntimeOptions(patches={"demo_typo": True})
    with pytest.raises(TypeError, match="frame_scan must be None, True or False"):
        ct.RuntimeOptions(frame_scan="yes")
    with pytest.raises(TypeError, match="patches must map switch names"):
        ct.RuntimeOptions(patches=["frame_scan"])
    with pytest.raises(ValueError, match="frame_scan is given twice"):
        ct.RuntimeOptions(frame_scan=True, patches={"frame_scan": False})
    with pytest.raises(AttributeError):
        ct.RuntimeOptions().no_such_switch  # noqa: B018


@pytest.mark.parametrize(
    ("declared", "error"),
    [
        ((("a", "ops", ()), ("a", "ops", ())), "two patches answer to the switch 'a'"),
        ((("a", "ops", ("b",)),), "requires 'b', which no patch answers to"),
        ((("a", "ops", ("b",)), ("b", "layers", ())), "cannot follow 'b' of a later stage"),
        ((("a", "ops", ("b",)), ("b", "ops", ("a",))), "has a cycle"),
    ],
)
def test_the_registry_refuses_declarations_it_cannot_order(declared, error):
    from cogvideox_torchax.patches.base import Patch
    from cogvideox_torchax.patches.registry import ordered

    with pytest.raises(RuntimeError, match=error):
        ordered([Patch(name, stage, "", None, requires=needs) for name, stage, needs in declared])
