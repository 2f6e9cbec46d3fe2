"""CogVideoX's patches, each apply_* alone: idempotent, state dict untouched, same result."""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSafeConv3d, CogVideoXSpatialNorm3D

import cogvideox_torchax as ct
from cogvideox_torchax import patches
from cogvideox_torchax._torch_compat import import_torchax
from cogvideox_torchax.families.cogvideox.patches import (
    causal_conv,
    frame_scan,
    safe_conv,
    spatial_norm,
    tiling,
    time_chunks,
)
from cogvideox_torchax.families.cogvideox.patches.spatial_norm import LowResSpatialNorm3D
from cogvideox_torchax.patches import group_norm
from cogvideox_torchax.platforms.build import build_plan
from cogvideox_torchax.platforms.run_plan import Placement
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents, upstream_decode

# torchax's device as this package imports it: "jax" is never registered with torch
# (cogvideox_torchax._torchax_device), so torch parses a module's .to() under its own name.
DEVICE = "privateuseone"

torchax = import_torchax()


@pytest.fixture
def fresh():
    return ct.random_upstream("tiny", seed=1)


def _keys_and_shapes(m):
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


@pytest.mark.parametrize(
    "apply",
    [
        safe_conv.apply_safe_conv,
        group_norm.apply_group_norm,
        causal_conv.apply_conv_cache_trim,
        causal_conv.apply_cache_first,
        spatial_norm.apply_low_res_spatial_norm,
        frame_scan.apply_frame_scan,
        tiling.apply_tile_batching,
    ],
)
def test_class_patches_are_idempotent_and_keep_eager_results(fresh, apply):
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    before = upstream_decode(fresh, z)
    keys = _keys_and_shapes(fresh)
    first = apply(fresh)
    assert first > 0
    assert apply(fresh) == 0
    assert _keys_and_shapes(fresh) == keys
    # Eager torch on plain tensors still runs the upstream computation.
    assert_close(upstream_decode(fresh, z), before, atol=1e-6, label=apply.__name__)


def test_group_norm_patch_count(fresh):
    n = sum(isinstance(m, torch.nn.GroupNorm) for m in fresh.modules())
    assert group_norm.apply_group_norm(fresh) == n
    assert all(type(m) is group_norm.JaxGroupNorm for m in fresh.modules() if isinstance(m, torch.nn.GroupNorm))


def _lowered_conv_count(module, shape):
    env = torchax.default_env()

    def run(w, b, x):
        with env, torch.no_grad():
            p = {"weight": env.j2t_iso(w), "bias": env.j2t_iso(b)}
            out = torch.func.functional_call(module, p, (env.j2t_iso(x),))
        return env.t2j_iso(out)

    spec = jax.ShapeDtypeStruct
    w = spec(tuple(module.weight.shape), jnp.float32)
    b = spec(tuple(module.bias.shape), jnp.float32)
    text = jax.jit(run).lower(w, b, spec(shape, jnp.float32)).as_text()
    return text.count("stablehlo.convolution")


def test_safe_conv_runs_one_convolution_where_upstream_chunks():
    # 1x8x40x2048x2048 counts as 2.5 "GB" upstream: two time chunks. Only
    # traced (abstract shapes), so nothing of that size is allocated.
    shape = (1, 8, 40, 2048, 2048)
    conv = CogVideoXSafeConv3d(8, 8, kernel_size=3, padding=(0, 1, 1)).eval()
    assert _lowered_conv_count(conv, shape) == 2
    holder = torch.nn.Sequential(conv)
    assert safe_conv.apply_safe_conv(holder) == 1
    assert _lowered_conv_count(conv, shape) == 1


def test_safe_conv_same_numbers_under_torchax():
    conv = CogVideoXSafeConv3d(4, 6, kernel_size=3, padding=(0, 1, 1)).eval()
    x = torch.randn(1, 4, 5, 6, 7)
    with torch.no_grad():
        expected = conv(x)
    safe_conv.apply_safe_conv(torch.nn.Sequential(conv))
    env = torchax.default_env()
    with env, torch.no_grad():
        got = conv.to(DEVICE)(x.to(DEVICE)).to("cpu")
    assert_close(got, expected, atol=1e-5, label="chunk-free conv")


@pytest.mark.parametrize("order", ["safe_conv first", "conv_bias first"])
def test_conv_patches_compose_in_either_order(fresh, order):
    first, second = (safe_conv.apply_safe_conv, patches.apply_conv_bias)
    if order == "conv_bias first":
        first, second = second, first
    first(fresh)
    second(fresh)
    safe = [m for m in fresh.modules() if isinstance(m, CogVideoXSafeConv3d)]
    assert safe and all(type(m) is patches.mixed(patches.FusedBiasConv, safe_conv.ChunkFreeSafeConv3d) for m in safe)
    convs = [m for m in fresh.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))]
    assert all(isinstance(m, patches.FusedBiasConv) for m in convs)
    assert safe_conv.apply_safe_conv(fresh) == 0 and patches.apply_conv_bias(fresh) == 0


@pytest.mark.parametrize("order", ["scan first", "tiles first"])
def test_frame_scan_and_tile_batching_compose_in_either_order(fresh, order):
    steps = [frame_scan.apply_frame_scan, tiling.apply_tile_batching]
    if order == "tiles first":
        steps.reverse()
    for apply in steps:
        assert apply(fresh) == 1
    assert isinstance(fresh, tiling.BatchedTilesMixin) and isinstance(fresh, frame_scan.FrameScanMixin)
    assert frame_scan.apply_frame_scan(fresh) == 0 and tiling.apply_tile_batching(fresh, tiles_per_step=2) == 0
    assert fresh.tiles_per_step == 2
    # One class per combination, reused: a second module patched alike gets the same class.
    other = ct.random_upstream("tiny", seed=1)
    for apply in steps:
        apply(other)
    assert type(other) is type(fresh)


def test_time_tap_patch_follows_cache_first_and_keeps_eager_results(fresh):
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    before = upstream_decode(fresh, z)
    assert causal_conv.apply_time_tap_conv(fresh) == 0  # nothing cache-first yet
    n = causal_conv.apply_cache_first(fresh)
    assert causal_conv.apply_time_tap_conv(fresh) == n > 0
    assert causal_conv.apply_time_tap_conv(fresh) == 0
    assert_close(upstream_decode(fresh, z), before, atol=1e-6, label="time taps, eager")


def test_patch_engages_on_cpu_fp32_only(tiny_upstream):
    fast = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    assert any(type(m) is causal_conv.TimeTapCausalConv3d for m in fast.module.modules())
    fp32 = fast.lower_decode((1, 4, 3, 4, 4)).as_text()
    # Each 3x3x3 causal conv becomes three 2-D convolutions: no rank-5 kernel is left.
    assert not re.search(r"stablehlo\.convolution[^\n]*tensor<3x3x3x\d+x\d+xf32>", fp32)
    assert re.search(r"stablehlo\.convolution[^\n]*tensor<3x3x\d+x\d+xf32>", fp32)
    bf16 = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", dtype="bfloat16").lower_decode((1, 4, 3, 4, 4)).as_text()
    assert re.search(r"stablehlo\.convolution[^\n]*tensor<3x3x3x\d+x\d+xbf16>", bf16)


def test_three_d_path_still_matches_upstream(tiny_upstream):
    # What GPU, TPU and bf16 run, checked here on the CPU.
    z = seeded_latents((1, 4, 5, 3, 4), seed=7)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(time_tap_conv=False))
    assert not any(type(m) is causal_conv.TimeTapCausalConv3d for m in vae.module.modules())
    assert_close(vae.decode(z).sample, upstream_decode(tiny_upstream, z), atol=2e-5, label="time_tap_conv=False")


def test_options_need_cache_first():
    with pytest.raises(ValueError, match="cache_first"):
        ct.RuntimeOptions(cache_first=False, time_tap_conv=True)
    plan = build_plan(ct.RuntimeOptions(cache_first=False), Placement("cpu", "float32"))
    assert dict(plan.skipped)["time_tap_conv"] == "needs cache_first"


def test_low_res_spatial_norm_builds_no_full_size_scale():
    # conv_y/conv_b of a 64-channel SpatialNorm on an 8x larger feature map:
    # upstream convolves the resized zq (a 64-channel full-size product);
    # the patch convolves zq itself and the resize fuses downstream.
    torch.manual_seed(0)
    norm = CogVideoXSpatialNorm3D(f_channels=64, zq_channels=4, groups=8).eval()
    f, zq = torch.randn(1, 64, 5, 16, 24), torch.randn(1, 4, 2, 2, 3)
    with torch.no_grad():
        expected, _ = norm(f, zq)
    env = torchax.default_env()
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in norm.state_dict().items()}

    def traced():  # a new function each time: jit caches traces per function
        def run(f, zq):
            with env, torch.no_grad():
                p = {k: env.j2t_iso(v) for k, v in params.items()}
                out, _ = torch.func.functional_call(norm, p, (env.j2t_iso(f), env.j2t_iso(zq)))
            return env.t2j_iso(out)

        return jax.jit(run)

    args = (jnp.asarray(f.numpy()), jnp.asarray(zq.numpy()))
    upstream_text = traced().lower(*args).as_text()
    assert spatial_norm.apply_low_res_spatial_norm(norm) == 1
    got = traced()(*args)
    assert_close(np.asarray(got), expected.numpy(), atol=1e-5, label="low-res SpatialNorm", check_dtype=False)
    text = traced().lower(*args).as_text()
    full = r"stablehlo\.convolution[^\n]*-> tensor<1x64x5x16x24xf32>"
    assert re.search(full, upstream_text) and not re.search(full, text)


@pytest.mark.parametrize("frames", [1, 4, 5])
def test_low_res_spatial_norm_block_broadcast_equals_upstream(frames):
    # The TPU plan's resize (time gathered and width repeated at latent
    # size, height broadcast over the activation split in blocks): upstream's
    # values, with no gather to the full size. fp32, 1e-5.
    torch.manual_seed(frames)
    norm = CogVideoXSpatialNorm3D(f_channels=64, zq_channels=4, groups=8).eval()
    f, zq = torch.randn(1, 64, frames, 16, 24), torch.randn(1, 4, (frames + 1) // 2, 2, 3)
    with torch.no_grad():
        expected, _ = norm(f, zq)
    assert spatial_norm.apply_low_res_spatial_norm(norm, block_broadcast=True) == 1 and norm.block_broadcast
    env = torchax.default_env()
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in norm.state_dict().items()}

    def run(f, zq):
        with env, torch.no_grad():
            p = {k: env.j2t_iso(v) for k, v in params.items()}
            out, _ = torch.func.functional_call(norm, p, (env.j2t_iso(f), env.j2t_iso(zq)))
        return env.t2j_iso(out)

    args = (jnp.asarray(f.numpy()), jnp.asarray(zq.numpy()))
    got = jax.jit(run)(*args)
    assert_close(np.asarray(got), expected.numpy(), atol=1e-5, label="block-broadcast SpatialNorm", check_dtype=False)
    text = jax.jit(run).lower(*args).as_text()
    # Time resized at latent size by slices and repeats (`take_indices`); nothing gathered at all.
    assert '"stablehlo.gather"' not in text


@pytest.mark.parametrize("chunk_frames,whole_frames", [(3, 0), (5, 8)])
def test_time_chunks_decode_equals_upstream(chunk_frames, whole_frames, monkeypatch):
    # The CUDA plan's time chunks (`time_chunks`), run on the CPU in
    # fp32 with chunks of one or three output frames at full resolution:
    # upstream's decode, scanned frame batches (caches) included. With
    # whole_frames=0 every convolution runs in chunks and every norm takes
    # its statistics frame by frame; with 8, inputs of up to 8 full frames
    # take them in one pass.
    upstream = ct.random_upstream("tiny", seed=2)
    z = torch.randn(1, 4, 5, 4, 4, generator=torch.Generator().manual_seed(3))
    expected = upstream_decode(upstream, z)
    vae = ct.wrap(upstream, dtype="float32", mesh="dp=1,tp=1", options=ct.RuntimeOptions(time_tap_conv=False))
    frame = 8 * 32 * 32  # channels x full resolution of the tiny config's last up block
    kwargs = dict(chunk_elements=chunk_frames * frame, whole_elements=whole_frames * frame)
    assert time_chunks.apply_time_chunks(vae.module, **kwargs) > 0
    assert time_chunks.apply_time_chunks(vae.module, **kwargs) == 0
    chunk_counts, by_frame = [], set()
    norm_act_conv, frames = time_chunks.norm_act_conv, LowResSpatialNorm3D.frames

    def counting(*args, **kwargs):
        result = norm_act_conv(*args, **kwargs)
        chunk_counts.append(0 if result is None else len(result[0]))
        return result

    def recording(self, *args, **kwargs):
        by_frame.add(kwargs["by_frame"])
        return frames(self, *args, **kwargs)

    monkeypatch.setattr(time_chunks, "norm_act_conv", counting)
    monkeypatch.setattr(LowResSpatialNorm3D, "frames", recording)
    got = vae.decode(z).sample
    assert max(chunk_counts) > 1  # some convolution did run in chunks
    assert by_frame == ({True} if whole_frames == 0 else {False, True}), by_frame
    assert_close(got, expected, atol=2e-5, label=f"time chunks of {chunk_frames} input frames")


def test_time_chunks_leave_small_convolutions_whole():
    # `time_chunks.WHOLE_ELEMENTS`: a convolution whose padded input and
    # output hold at most that many elements runs whole (its chunks cost
    # compile time and saved little memory).
    conv = types.SimpleNamespace(time_kernel_size=3, conv=types.SimpleNamespace(out_channels=128))
    x = types.SimpleNamespace(shape=(1, 128, 8, 480, 720))  # the 2b model's last up block: 0.74 x 2^30
    assert time_chunks._chunk_frames(conv, x, 2**28, 2**30) is None
    wide = types.SimpleNamespace(shape=(1, 256, 8, 480, 720))  # its first convolution, 256 -> 128: 1.15 x 2^30
    assert time_chunks._chunk_frames(conv, wide, 2**28, 2**30) == 1
    assert time_chunks._chunk_frames(conv, x, 2**28, 0) == 4
