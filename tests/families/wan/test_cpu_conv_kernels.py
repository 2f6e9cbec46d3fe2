"""wan_cpu_conv_kernels: on jax 0.10 Wan's CPU fp32 programs alone run without YNNPACK fusions, equal to upstream."""

import jax
import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.families.wan.patches import cpu_conv_kernels
from cogvideox_torchax.families.wan.patches.cpu_conv_kernels import NO_YNN_FUSIONS
from cogvideox_torchax.patches import KEEP_BARRIERS_COMPILER_OPTIONS
from cogvideox_torchax.platforms.build import build_plan, compiler_options
from cogvideox_torchax.platforms.run_plan import Placement
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode

CPU_FP32 = Placement("cpu", "float32")


@pytest.fixture
def any_jax(monkeypatch):
    """The patch applies on this stack's jax whatever its version (the option itself is known to both)."""
    monkeypatch.setattr(cpu_conv_kernels, "LAST_MEASURED_FASTER", (99, 0))


def test_only_the_wan_cpu_fp32_plan_compiles_without_ynn_fusions(any_jax):
    plan = build_plan(ct.RuntimeOptions(dtype="float32"), CPU_FP32, "wan")
    assert plan.applies("wan_cpu_conv_kernels")
    # YNNPACK's fusions off; barriers kept, for the tap kernel's output barrier (`wan_time_taps`).
    assert {**NO_YNN_FUSIONS, **KEEP_BARRIERS_COMPILER_OPTIONS}.items() <= (compiler_options(plan) or {}).items()
    for platform, dtype in (("cpu", "bfloat16"), ("cuda", "float32"), ("cuda", "bfloat16"), ("tpu", "float32"),
                            ("rocm", "float32")):
        other = build_plan(ct.RuntimeOptions(dtype=dtype), Placement(platform, dtype), "wan")
        assert not other.applies("wan_cpu_conv_kernels"), (platform, dtype)
        assert "xla_cpu_experimental_ynn_fusion_type" not in (compiler_options(other) or {}), (platform, dtype)
    # Without the time taps the program's convolutions are 3-D: not measured, not applied.
    no_taps = build_plan(ct.RuntimeOptions(dtype="float32", wan_time_taps=False), CPU_FP32, "wan")
    assert not no_taps.applies("wan_cpu_conv_kernels")
    assert dict(no_taps.skipped)["wan_cpu_conv_kernels"] == "needs wan_time_taps"
    # CogVideoX's CPU programs are compiled as before.
    cogvideox = build_plan(ct.RuntimeOptions(dtype="float32"), CPU_FP32, "cogvideox")
    assert "xla_cpu_experimental_ynn_fusion_type" not in (compiler_options(cogvideox) or {})
    with pytest.raises(ValueError, match="cannot apply to CogVideoX"):
        build_plan(ct.RuntimeOptions(dtype="float32", wan_cpu_conv_kernels=True), CPU_FP32, "cogvideox")


@pytest.mark.parametrize("version", [(0, 10, 2), (0, 11, 2), (0, 12, 0, 1)])
def test_only_jax_0_10_keeps_the_fusions_off(monkeypatch, version):
    # Measured faster on jax 0.10.2 only; jax 0.12's YNNPACK fusions are the faster.
    monkeypatch.setattr(jax, "__version_info__", version)
    plan = build_plan(ct.RuntimeOptions(dtype="float32"), CPU_FP32, "wan")
    assert plan.applies("wan_cpu_conv_kernels") == (version[:2] == (0, 10))
    if version[:2] != (0, 10):
        assert "YNNPACK's fusions measured faster" in dict(plan.skipped)["wan_cpu_conv_kernels"]
        assert "xla_cpu_experimental_ynn_fusion_type" not in (compiler_options(plan) or {})


def test_the_wrapped_vae_compiles_with_the_option_and_equals_upstream(any_jax, wan_tiny_upstream):
    on = ct.wrap(wan_tiny_upstream, dtype="float32", mesh="dp=1,tp=1",
                 options=ct.RuntimeOptions(wan_cpu_conv_kernels=True))
    assert NO_YNN_FUSIONS.items() <= (on.compiler_options or {}).items()
    z = seeded_latents((1, 16, 3, 4, 5), seed=3)
    got = on.decode(z).sample
    assert_close(got, upstream_decode(wan_tiny_upstream, z), atol=1e-5, label="YNNPACK fusions off vs upstream")
    off = ct.wrap(wan_tiny_upstream, dtype="float32", mesh="dp=1,tp=1",
                  options=ct.RuntimeOptions(wan_cpu_conv_kernels=False))
    assert "xla_cpu_experimental_ynn_fusion_type" not in (off.compiler_options or {})
    assert_close(got, off.decode(z).sample, atol=1e-5, label="YNNPACK fusions off vs on")


def test_this_jax_knows_the_option():
    # jax refuses an option its XLA does not know: a jax that dropped this one would fail every Wan CPU compile.
    lowered = jax.jit(lambda x: x * 2).lower(jax.numpy.ones(3))
    assert lowered.compile(compiler_options=dict(NO_YNN_FUSIONS))(jax.numpy.ones(3)).tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(Exception, match="No such compile option"):
        lowered.compile(compiler_options={"xla_cpu_no_such_option_here": ""})
