"""LTX-2's reflection padding on the CUDA plan (``zero_pad_reflection``): upstream's values, no concatenation.

What the switch saves at the real config's sizes (the H200 program's data movement 26 -> 5 GiB
per 121 x 512x768 decode) is on docs/results/h200-padded-inputs-2026-11-29.md; at the tiny
config's sizes XLA fuses neither padding into its producer and writes more with the border rows,
so what is checked here is how the padding is written.
"""

import jax.numpy as jnp

import cogvideox_torchax as ct
from cogvideox_torchax.platforms import hlo
from cogvideox_torchax.vae.program_cache import ProgramKey
from cogvideox_torchax.vae.torchax_vae import to_host_torch
from tests.support.compilers import require_compiler
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode


def test_cuda_plan_decodes_as_upstream_in_fp32(ltx2_tiny_upstream, ltx2_tiny):
    assert ltx2_tiny_upstream.config.decoder_spatial_padding_mode == "reflect"
    assert "zero_pad_reflection" in ltx2_tiny.plan_for("cuda").steps
    assert "zero_pad_reflection" not in ltx2_tiny.plan_for("cpu").steps + ltx2_tiny.plan_for("tpu").steps
    z = seeded_latents((1, 8, 2, 3, 5), seed=2)
    program = ltx2_tiny.programs.program(ProgramKey("cuda"))
    got = to_host_torch(program.jits["decode"](ltx2_tiny.weights, jnp.asarray(z.numpy())))
    # fp32, the padding copies values: the largest seen here is 2e-6, as the CPU plan's.
    assert_close(got, upstream_decode(ltx2_tiny_upstream, z), atol=1e-4, label="ltx2-tiny cuda plan fp32")


def test_h200_program_pads_by_reflection_without_concatenating(ltx2_tiny_upstream):
    require_compiler("cuda")
    found = {}
    for on in (None, False):  # the plan's default, and the switch off
        switches = {} if on is None else {"zero_pad_reflection": on}
        vae = ct.wrap(ltx2_tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(dtype="bfloat16", **switches))
        found[on] = hlo.executed_summary(vae.compile_decode((1, 8, 2, 8, 8), target="h200").as_text())
    # jnp.pad's reflection is concatenations of slices; the zero pad and its border rows are not.
    assert found[False]["movement_bytes_by_op"].get("concatenate", 0) > 0
    assert "concatenate" not in found[None]["movement_bytes_by_op"]
    assert found[None]["movement_bytes_by_op"].get("pad", 0) > 0
    assert found[None]["convolution_calls"] == found[False]["convolution_calls"]
