"""Wan's GPU and TPU patches run on the CPU in fp32: upstream's values (1e-5), on the platforms their plans name."""

import copy

import jax.numpy as jnp
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.families.wan.patches import (
    attention_block,
    frame_scan,
    norm_input,
    padded_cache,
    resample,
    scan_output,
    tail_chunks,
)
from cogvideox_torchax.platforms.build import build_plan
from cogvideox_torchax.platforms.run_plan import Placement
from cogvideox_torchax.vae.program_cache import ProgramKey
from cogvideox_torchax.vae.torchax_vae import to_host_torch
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode

LAYOUT = {"wan_resample_conv3d", "wan_attention_block", "wan_video_carry"}


def _run(vae, platform: str, kind: str, x: torch.Tensor) -> torch.Tensor:
    # The platform's program (its plan's patched module), run here on the CPU.
    program = vae.programs.program(ProgramKey(platform))
    return to_host_torch(program.jits[kind](vae.weights, jnp.asarray(x.numpy())))


def _encode_reference(upstream, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return upstream._encode(x)


def test_each_platform_plans_its_patches(wan_tiny):
    cuda, tpu, cpu = (set(wan_tiny.plan_for(p).steps) for p in ("cuda", "tpu", "cpu"))
    assert LAYOUT <= cuda and "wan_norm_input" not in cuda
    assert LAYOUT | {"wan_norm_input"} <= tpu
    assert not (LAYOUT | {"wan_norm_input"}) & cpu
    # The padded input written once: measured on the compiled H200 program only.
    assert "wan_padded_cache" in cuda and "wan_padded_cache" not in tpu | cpu
    forced = ct.RuntimeOptions(dtype="bfloat16", wan_norm_input=True)
    with pytest.raises(ValueError, match="wan_norm_input=True cannot apply on cuda bfloat16 dp=1,tp=1: measured"):
        build_plan(forced, Placement("cuda", "bfloat16"), "wan")
    assert "wan_norm_input" in build_plan(forced, Placement("tpu", "bfloat16", 1, 8), "wan").steps


# Frame counts: the first latent frame alone (1), one scan step (2), several (5);
# odd and non-square sizes.
@pytest.mark.parametrize("shape", [(1, 16, 1, 4, 4), (1, 16, 2, 3, 5), (1, 16, 5, 5, 3)])
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerator_plans_decode_as_upstream_in_fp32(wan_tiny_upstream, wan_tiny, platform, shape):
    z = seeded_latents(shape, seed=shape[2])
    assert_close(_run(wan_tiny, platform, "decode", z), upstream_decode(wan_tiny_upstream, z), atol=1e-5,
                 label=f"wan-tiny {platform} plan fp32 {shape}")


def test_cuda_plan_with_tail_chunks_decodes_as_upstream(wan_tiny_upstream):
    # wan_padded_cache hands on each cache its convolution cut; the tail's pieces walk the same
    # caches twice, the second handed the first's cut: each entry must end as the last cut.
    vae = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(wan_tail_chunks=True))
    assert {"wan_padded_cache", "wan_tail_chunks"} <= set(vae.plan_for("cuda").steps)
    # In front of the tail's forward (which calls no super()), or it would never collect a cut.
    order = type(vae.programs.program(ProgramKey("cuda")).module.decoder).__mro__
    assert order.index(padded_cache.PaddedCacheDecoder) < order.index(tail_chunks.TailChunkedDecoderMixin)
    z = seeded_latents((1, 16, 5, 5, 3), seed=5)
    assert_close(_run(vae, "cuda", "decode", z), upstream_decode(wan_tiny_upstream, z), atol=1e-5,
                 label="wan-tiny cuda plan with tail chunks fp32")


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerator_plans_decode_wan22_paths_as_upstream(wan22_tiny_upstream, wan22_tiny, platform):
    # Residual up blocks (DupUp3D beside the resamplers), 2x2 patches.
    z = seeded_latents((1, 4, 5, 3, 2), seed=5)
    assert_close(_run(wan22_tiny, platform, "decode", z), upstream_decode(wan22_tiny_upstream, z), atol=1e-5,
                 label=f"wan2.2-tiny {platform} plan fp32")


@pytest.mark.parametrize(("config", "shape", "tile"), [
    ("wan-tiny", (1, 16, 3, 9, 13), (32, 48, 24, 32)),
    ("wan2.2-tiny", (1, 4, 2, 5, 7), (64, 64, 48, 48)),  # 2x2 patches: the tiles blended before unpatchifying
])
def test_accelerator_plans_decode_tiles_as_upstream(request, config, shape, tile):
    # Upstream's tiled decode, each tile group's frames one loop carrying its video (wan_video_carry).
    fixture = config.replace("-", "_").replace(".", "")
    upstream, vae = request.getfixturevalue(f"{fixture}_upstream"), request.getfixturevalue(fixture)
    tiling = dict(zip(("tile_sample_min_height", "tile_sample_min_width", "tile_sample_stride_height",
                       "tile_sample_stride_width"), tile, strict=True))
    z = seeded_latents(shape)
    program = vae.programs.program(ProgramKey.of("cuda", tiling))
    assert {"wan_video_carry", "wan_tile_batching"} <= set(program.plan.steps)
    got = to_host_torch(program.jits["decode"](vae.weights, jnp.asarray(z.numpy())))
    upstream.enable_tiling(**tiling)
    try:
        expected = upstream_decode(upstream, z)
    finally:
        upstream.disable_tiling()
    assert_close(got, expected, atol=1e-5, label=f"{config} cuda plan tiled")


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerator_plans_encode_as_upstream(wan_tiny_upstream, wan_tiny, wan22_tiny_upstream, wan22_tiny,
                                              platform):
    # The downsamplers as 3-D convolutions, the middle block's attention on one latent frame.
    x = torch.rand(1, 3, 9, 32, 24, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert_close(_run(wan_tiny, platform, "encode", x), _encode_reference(wan_tiny_upstream, x), atol=1e-5,
                 label=f"wan-tiny {platform} plan encode")
    x = x[..., :32, :16]  # Wan 2.2's 16x compression
    assert_close(_run(wan22_tiny, platform, "encode", x), _encode_reference(wan22_tiny_upstream, x), atol=1e-5,
                 label=f"wan2.2-tiny {platform} plan encode")


@pytest.mark.parametrize(
    "apply", [resample.apply_resample_conv3d, attention_block.apply_attention_block, norm_input.apply_norm_input,
              scan_output.apply_video_carry, padded_cache.apply_padded_cache],
)
def test_the_patched_module_runs_eagerly_as_upstream(wan_tiny_upstream, apply):
    patched = copy.deepcopy(wan_tiny_upstream)
    if apply is scan_output.apply_video_carry:  # it replaces the frame scan's loop, so it goes on top of it
        frame_scan.apply_frame_scan(patched)
    assert apply(patched) >= 1 and apply(patched) == 0
    z = seeded_latents((1, 16, 3, 2, 3))
    x = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    with torch.no_grad():
        assert torch.equal(patched.decode(z).sample, wan_tiny_upstream.decode(z).sample)
        assert torch.equal(patched.encode(x).latent_dist.mean, wan_tiny_upstream.encode(x).latent_dist.mean)


def test_video_carry_refuses_another_family_and_a_module_without_the_frame_scan(tiny_upstream, wan_tiny_upstream):
    with pytest.raises(TypeError, match="AutoencoderKLWan"):
        scan_output.apply_video_carry(tiny_upstream)
    with pytest.raises(ValueError, match="frame scan first"):
        scan_output.apply_video_carry(copy.deepcopy(wan_tiny_upstream))


def test_video_carry_refuses_a_step_of_another_length():
    # The video's length is fixed before the loop: a step giving 3 frames where 4 are due would leave zeros.
    import jax.numpy as jnp

    from cogvideox_torchax.patches.base import torchax

    env = torchax.default_env()

    def step(z_frame, cache):
        frames = 1 if cache is None else 3
        return env.j2t_iso(jnp.zeros((1, 3, frames, 2, 2))), env.j2t_iso(jnp.zeros((1, 1)))

    with env, pytest.raises(ValueError, match="gave 3 frames for each later latent frame, the video carry expects 4"):
        scan_output.decode_into_video(step, env.j2t_iso(jnp.zeros((1, 16, 3, 2, 2))))
