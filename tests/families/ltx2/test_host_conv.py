"""``host_conv``: where the CPU plan runs convolutions by the host's torch, and that upstream's results stay.

What it saves is a benchmark's to say (docs/results/ltx2-cpu-host-conv-2026-12-08.md); here, which
placements take it, which convolutions it moves, and that a program holding both kinds decodes and
encodes as upstream does.
"""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.config import preset_config
from cogvideox_torchax.families.ltx2.patches import host_conv
from cogvideox_torchax.platforms import hlo
from cogvideox_torchax.platforms.build import build_plan
from cogvideox_torchax.platforms.run_plan import Placement
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode


@pytest.mark.parametrize("family", ["ltx2", "ltx-video"])
def test_only_one_device_fp32_cpu_programs_of_the_ltx_families_take_it(family):
    fp32 = ct.RuntimeOptions(dtype="float32")
    plan = build_plan(fp32, Placement("cpu", "float32"), family)
    assert "host_conv" in plan.steps and "host's torch" in plan.as_dict()["conv"]["layout"] and "host's" in str(plan)
    skipped = dict(build_plan(fp32, Placement("cpu", "float32", dp=2, tp=1), family).skipped)
    assert skipped["host_conv"].startswith("one device only")
    skipped = dict(build_plan(ct.RuntimeOptions(dtype="bf16"), Placement("cpu", "bfloat16"), family).skipped)
    assert skipped["host_conv"] == "measured in fp32 only"
    for platform in ("cuda", "tpu"):
        assert "host_conv" not in build_plan(fp32, Placement(platform, "float32"), family).steps
    with pytest.raises(ValueError, match="host_conv=True cannot apply"):
        build_plan(ct.RuntimeOptions(dtype="float32", host_conv=True), Placement("cpu", "float32"), "cogvideox")


def test_the_rule_moves_narrow_convolutions_and_wide_ones_that_pad_themselves():
    def conv(channels, mode, padding=1):
        return torch.nn.Conv3d(channels, 8, 3, padding=padding, padding_mode=mode)

    assert host_conv.runs_on_host(conv(128, "reflect")) and host_conv.runs_on_host(conv(1023, "zeros", 0))
    # At 1024 input channels, oneDNN was the faster only padding zeros itself (the module's docs).
    assert host_conv.runs_on_host(conv(1024, "zeros"))
    assert not host_conv.runs_on_host(conv(1024, "reflect")) and not host_conv.runs_on_host(conv(1024, "zeros", 0))


@pytest.fixture(scope="module")
def mixed():
    """LTX-2's tiny VAE whose CPU program holds both kinds of convolution: patched under a lowered threshold.

    The program is built (the plan applied) inside the threshold's change, which ends before any test runs.
    """
    upstream = ct.random_upstream("ltx2-tiny", seed=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host_conv, "HOST_BELOW_CHANNELS", 32)
        vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(dtype="float32"))
        vae.programs.program(vae.programs.platform_key("cpu"))
    return upstream, vae


def test_a_program_of_both_kinds_decodes_and_encodes_as_upstream(mixed):
    upstream, vae = mixed
    assert preset_config("ltx2-tiny")["decoder_spatial_padding_mode"] == "reflect"
    assert host_conv.HOST_BELOW_CHANNELS == 1024  # the fixture's change ended
    z = seeded_latents((1, 8, 2, 3, 5), seed=1)
    ops = {c.op for c in hlo.compiled_ops(vae.compile_decode(tuple(z.shape)).as_text())[0]}
    assert ops == {"host-conv", "convolution"}
    # fp32; the largest seen here is 2e-6, as XLA's alone.
    assert_close(vae.decode(z).sample, upstream_decode(upstream, z), atol=1e-4, label="ltx2-tiny, both kinds")
    x = torch.rand((1, 3, 9, 16, 24), generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        expected = upstream.encode(x).latent_dist.mean
    assert_close(vae.encode(x).latent_dist.mean, expected, atol=1e-5, label="ltx2-tiny encode, both kinds")


def test_the_weights_torch_reads_stay_in_upstreams_layout(mixed):
    _, vae = mixed
    program = vae.programs.program(vae.programs.platform_key("cpu"))
    on_host = {f"{path}.weight" for path, m in program.module.named_modules()
               if getattr(m, "conv_policy", None) is not None and m.conv_policy.host}
    layouts = {side: program.layout(side).transposed for side in ("decode", "encode")}
    assert on_host and not on_host & (layouts["decode"] | layouts["encode"])
    # The decoder's other convolutions, XLA's channels-last ones, still take theirs transposed once; the
    # encoder pads with zeros, so all of its are torch's.
    assert layouts["decode"] and not layouts["encode"]


@pytest.mark.parametrize("preset", ["ltx2-tiny", "ltx-tiny"])
def test_without_it_xlas_convolutions_decode_as_upstream(preset):
    # The tiny configs' convolutions are all narrow, so the default runs none of XLA's; without the
    # switch, all are XLA's (channels-last, the weights transposed once), as a wider config's are.
    upstream = ct.random_upstream(preset, seed=0)
    vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(dtype="float32", host_conv=False))
    z = seeded_latents((1, 8, 2, 3, 5), seed=3)
    # LTX-Video's conditioned decoder takes the decode timestep, as its pipelines pass it (0).
    args = tuple(torch.as_tensor(v, dtype=z.dtype) for v in families.of_module(upstream).decode_input_values(
        upstream.config, 1, {}))
    ops = {c.op for c in hlo.compiled_ops(vae.compile_decode(tuple(z.shape)).as_text())[0]}
    assert ops == {"convolution"}
    with torch.no_grad():
        expected = upstream.decode(z, *args).sample
    # fp32; the largest seen here is 2e-6.
    assert_close(vae.decode(z, *args).sample, expected, atol=1e-4, label=f"{preset} without host_conv")
