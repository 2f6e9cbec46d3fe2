"""wan_time_taps: where the plan applies it, and that decoding and encoding with it equals upstream and the 3-D form."""

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

import cogvideox_torchax as ct
from cogvideox_torchax.families.wan.patches.time_taps import TimeTapConvMixin, apply_time_taps
from cogvideox_torchax.platforms.build import build_plan
from cogvideox_torchax.platforms.run_plan import Placement
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode


def test_the_cpu_fp32_plan_alone_runs_time_taps():
    plan = build_plan(ct.RuntimeOptions(dtype="float32"), Placement("cpu", "float32"), "wan")
    assert plan.applies("wan_time_taps")
    for platform, dtype in (("cpu", "bfloat16"), ("cpu", "float16"), ("cuda", "float32"), ("tpu", "float32"),
                            ("rocm", "float32")):  # fmt: skip
        plan = build_plan(ct.RuntimeOptions(dtype=dtype), Placement(platform, dtype), "wan")
        assert not plan.applies("wan_time_taps") and dict(plan.skipped)["wan_time_taps"], (platform, dtype)
    # CogVideoX's plan never holds it (its own time taps are time_tap_conv).
    cogvideox = build_plan(ct.RuntimeOptions(dtype="float32"), Placement("cpu", "float32"), "cogvideox")
    assert "wan_time_taps" not in cogvideox.steps and "wan_time_taps" not in dict(cogvideox.skipped)
    with pytest.raises(ValueError, match="wan_time_taps=True cannot apply to CogVideoX"):
        build_plan(ct.RuntimeOptions(dtype="float32", wan_time_taps=True), Placement("cpu", "float32"), "cogvideox")
    with pytest.raises(ValueError, match="fp32 only"):
        build_plan(ct.RuntimeOptions(dtype="bfloat16", wan_time_taps=True), Placement("cpu", "bfloat16"), "wan")


def test_every_causal_conv_is_patched_once_and_still_runs_eagerly(wan_tiny_upstream):
    module = ct.random_upstream("wan-tiny", seed=0)
    convs = [m for m in module.modules() if isinstance(m, WanCausalConv3d)]
    assert apply_time_taps(module) == len(convs) > 10
    assert apply_time_taps(module) == 0
    assert all(isinstance(m, TimeTapConvMixin) for m in convs)
    z = seeded_latents((1, 16, 2, 3, 3), seed=0)
    with torch.no_grad():  # torch tensors: upstream's own forward
        assert torch.equal(module.decode(z).sample, ct.random_upstream("wan-tiny", seed=0).decode(z).sample)


@pytest.mark.parametrize("shape", [(1, 16, 1, 3, 5), (1, 16, 4, 4, 3), (2, 16, 2, 2, 2)])
def test_decode_equals_upstream_and_the_3d_convolutions(wan_tiny_upstream, wan_tiny, shape):
    assert wan_tiny.plan.applies("wan_time_taps")
    z = seeded_latents(shape, seed=shape[2])
    got = wan_tiny.decode(z).sample
    assert_close(got, upstream_decode(wan_tiny_upstream, z), atol=1e-5, label=f"time taps vs upstream {shape}")
    without = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(wan_time_taps=False))
    assert not without.plan.applies("wan_time_taps")
    assert_close(got, without.decode(z).sample, atol=1e-5, label=f"time taps vs 3-D convolutions {shape}")


def test_encode_equals_upstream(wan_tiny_upstream, wan_tiny):
    video = torch.rand((1, 3, 9, 16, 24), generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        expected = wan_tiny_upstream.encode(video).latent_dist.mean
    assert_close(wan_tiny.encode(video).latent_dist.mean, expected, atol=1e-5, label="encode with time taps")
