"""Programs compiled for accelerators that are not here, by their real compilers (the ``aot`` extra).

`cogvideox_torchax.platforms.accelerators` gives compile-only GPU and TPU devices; what is
checked here is the optimized program those compilers return: its
convolutions, their dtypes and layouts, and its memory per device.
"""

import copy
import json
import subprocess
import sys

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.memory import budget
from cogvideox_torchax.platforms import accelerators, hlo
from tests.support.compilers import require_compiler

_TINY = (1, 4, 3, 8, 16)  # one frame batch (3 latent frames at once), both upsamplers, every SpatialNorm
_SCANNED = (1, 4, 7, 8, 16)  # three frame batches: the first, then a scan of two steps


@pytest.fixture(scope="module")
def tiny_bf16(tiny_upstream):
    return ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1")


def test_known_targets_and_their_budgets():
    assert set(accelerators.TARGETS) == {
        "h100", "h200", "b200", "gb200", "b300", "v5e-1", "v5e-8", "v6e-1", "v6e-8", "v5p-1", "v5p-4", "v7x-1", "v7x-4",
    }
    assert accelerators.get("H200").platform == "cuda" and accelerators.get("v6e-8").devices == 8
    # GPUs: JAX's default 75 % preallocation; TPUs: the HBM their compiler reports.
    assert accelerators.get("h100").budget == int(84_942_979_072 * 0.75)
    assert accelerators.get("v6e-1").budget == int(31.25 * 2**30) and accelerators.get("v5e-8").budget == int(15.75 * 2**30)
    # TPU programs are compiled told the plans' usable HBM (libtpu 0.0.50 packs loosely below the chip's):
    # 90 % of 31.25 GiB; GPUs take no such option.
    assert budget.compiler_options(accelerators.get("v6e-1")) == {"xla_tpu_max_hbm_size_mib": "28800"}
    assert budget.compiler_options(accelerators.get("h200")) is None
    # A compile-only GPU program lacks the cuDNN workspaces autotuning picks on the device (measured on an
    # H100: 1.28 and 1.35 GiB more than compiled without it, 1.57 against jax 0.12's): every CUDA target's
    # plans count 1.6 GiB more; TPUs none.
    assert accelerators.CUDA_AUTOTUNE_ALLOWANCE == int(1.6 * 2**30)
    assert {accelerators.get(n).autotune_allowance for n in ("h100", "h200", "b200", "gb200", "b300")} == {
        accelerators.CUDA_AUTOTUNE_ALLOWANCE
    }
    assert {a.autotune_allowance for a in accelerators.TARGETS.values() if a.platform == "tpu"} == {0}
    with pytest.raises(ValueError, match="known targets: h100, h200, b200"):
        accelerators.get("a100")
    with pytest.raises(ValueError, match="needs 16 devices; target v6e-8 has 8"):
        accelerators.target_mesh("v6e-8", "dp=2,tp=8")


def test_h200_program_runs_cudnn_convs_with_the_bias_fused_and_bf16_activations(tiny_bf16):
    require_compiler("cuda")
    compiled = tiny_bf16.compile_decode(_TINY, target="h200")
    text = compiled.as_text()
    convs, moves = hlo.compiled_ops(text)
    assert len(convs) >= 60
    # Every convolution is one cuDNN call: the bias is in its fp32 epilogue, not a separate add.
    assert all(c.op == "cudnn-conv" for c in convs)
    # All NCDHW, the layout XLA GPU gives 3-D convolutions, and no activation
    # moved to another layout or copied (the smallest activation: 8 channels
    # at latent size; with 2-D upsampler convs and channels-last writing
    # there were 20 transposes and copies here).
    assert {c.dim_labels for c in convs} == {"bf012_oi012->bf012"}
    smallest = _TINY[0] * 8 * _TINY[2] * _TINY[3] * _TINY[4]
    assert [m for m in moves if m.elements >= smallest] == []
    summary = hlo.compiled_summary(text, min_elements=smallest)
    assert summary["activation_layout_changes"] == summary["activation_copies"] == 0 and summary["collectives"] == {}
    # Per call, what a profile on the device counts: one cuDNN call per convolution of
    # the text here (one frame batch, no loop); at 7 latent frames (3 batches, the last
    # two a scan of 2 steps) three times as many, though the text holds two batches' worth.
    assert summary["convolution_calls"] == len(convs)
    longer = hlo.compiled_ops(scanned := tiny_bf16.compile_decode(_SCANNED, target="h200").as_text())[0]
    assert len(longer) == 2 * len(convs) and " while(" in scanned
    executed = hlo.executed_summary(scanned)
    assert executed["convolution_calls"] == 3 * len(convs)
    # In the scan's steps each causal convolution's padded input (cache, then the frames) is
    # written once, by the fusion computing the norm and SiLU: no concatenation copies it
    # again, except conv_in's, whose frames are a slice of the latents (4 channels, 2 cache
    # and 2 new frames, bf16, in each of the 2 steps). Concatenating apart from the norm
    # wrote 17x that here, and 53 of the 93 GiB of data movement per 2b decode at 13x60x90.
    _, channels, _, height, width = _SCANNED
    assert executed["movement_bytes_in_loops_by_op"].get("concatenate", 0) <= 2 * channels * 4 * height * width * 2
    # fp32 results only for SpatialNorm's 1x1x1 convs at latent resolution (on purpose).
    batch, _, frames, height, width = _TINY
    latent_res = batch * 32 * (frames + 1) * height * width
    assert all(c.dtype == "bf16" for c in convs if c.elements > latent_res), [c for c in convs if c.dtype != "bf16"]
    assert max(c.elements for c in convs) < 2**31
    plan = tiny_bf16.memory_plan(_TINY, target="h200")
    assert plan.target == "h200" and plan.mesh == (1, 1) and plan.name == "whole"
    assert 0 < plan.bytes <= plan.budget == budget.usable(accelerators.get("h200").budget)
    # The plan's need: the compiled program and the workspaces the device will add to it.
    assert plan.allowance == accelerators.CUDA_AUTOTUNE_ALLOWANCE
    assert plan.bytes == budget.compiled_bytes(compiled) + plan.allowance
    assert tiny_bf16.compiled_shapes() == []  # a target's plans are not the VAE's own


def test_h200_fp16_program_fuses_the_bias_into_cudnn_convs_with_fp16_activations(tiny_upstream):
    require_compiler("cuda")
    # wrap of a float16 module (CogVideoX-2b's published torch_dtype) runs in float16.
    # A copy: the session's module stays fp32 for the tests after this one.
    vae = ct.wrap(copy.deepcopy(tiny_upstream).half(), mesh="dp=1,tp=1")
    convs, _ = hlo.compiled_ops(vae.compile_decode(_TINY, target="h200").as_text())
    assert len(convs) >= 60 and all(c.op == "cudnn-conv" for c in convs)  # the fp32 bias in cuDNN's epilogue
    batch, _, frames, height, width = _TINY
    latent_res = batch * 32 * (frames + 1) * height * width  # SpatialNorm's fp32 1x1x1 convs
    assert all(c.dtype == "f16" for c in convs if c.elements > latent_res), [c for c in convs if c.dtype != "f16"]


@pytest.mark.slow
def test_h200_program_at_1080p_keeps_its_invariants(vae_15):
    # Frames above 768x1360: one 256-channel frame exceeds the time chunks'
    # 2^28 elements, so the plan splits convolutions within frames. Still
    # all cuDNN, all NCDHW, bf16, none near 2^31, no activation moved.
    require_compiler("cuda")
    shape = (1, 16, 2, 135, 240)
    text = vae_15.compile_decode(shape, target="h200").as_text()
    convs, moves = hlo.compiled_ops(text)
    assert len(convs) >= 200 and all(c.op == "cudnn-conv" for c in convs)
    assert {c.dim_labels for c in convs} == {"bf012_oi012->bf012"}
    assert max(c.elements for c in convs) <= 2**28
    latent_res = 512 * 3 * 135 * 240  # SpatialNorm's fp32 1x1x1 convs (up to 512 channels) at latent resolution
    assert all(c.dtype == "bf16" for c in convs if c.elements > latent_res)
    summary = hlo.compiled_summary(text, min_elements=128 * 1080 * 1920)
    assert summary["activation_layout_changes"] == 0


def test_tpu_program_over_two_chips_shards_width(tiny_bf16):
    require_compiler("tpu")
    # About 25 s on 2 cores: the TPU compiler is slow.
    compiled = tiny_bf16.compile_decode(_TINY, target="v6e-8", mesh="dp=1,tp=2")
    text = compiled.as_text()
    convs, _ = hlo.compiled_ops(text)
    assert len(convs) >= 60 and {c.dtype for c in convs if c.elements > 4096} == {"bf16"}
    assert "collective-permute" in text or "all-gather" in text  # the width halo crosses chips
    assert hlo.compiled_summary(text)["collectives"]
    plan = tiny_bf16.memory_plan(_TINY, target="v6e-8", mesh="dp=1,tp=2")
    assert plan.mesh == (1, 2) and plan.target == "v6e-8"


def test_refused_bytes_reads_the_tpu_compilers_refusal():
    error = RuntimeError(
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
        "Used 54.54G of 31.25G hbm. ... the total memory required for HLO temporaries (54.54G) exceeds "
        "available HBM (31.25G)."
    )
    assert budget.refused_bytes(error) == int(54.54 * 2**30)
    assert budget.refused_bytes(RuntimeError("INTERNAL: something else")) is None


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cogvideox_torchax.decode", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_dry_run_plans_for_a_target_and_target_needs_dry_run(tmp_path):
    require_compiler("cuda")
    import safetensors.torch
    import torch

    latents = tmp_path / "z.safetensors"
    safetensors.torch.save_file({"z": torch.randn(_TINY)}, str(latents))
    base = [str(latents), "--model", "random:tiny", "--dtype", "bf16"]
    done = _cli(*base, "--dry-run", "--target", "h200", "--json", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the compiler plugins start silently
    s = json.loads(done.stdout)
    assert s["target"]["name"] == "h200" and s["plan"]["target"]["platform"] == "cuda"
    assert s["memory_plan"]["target"] == "h200" and s["per_device_bytes"]["temp"] > 0
    allowance = accelerators.CUDA_AUTOTUNE_ALLOWANCE
    assert s["target"]["autotune_allowance"] == s["memory_plan"]["allowance"] == allowance
    assert s["memory_plan"]["bytes"] == sum(s["per_device_bytes"].values()) + allowance
    assert s["compiled"]["convolutions"] >= 60 and s["plan_s"] > 0
    text = _cli(*base, "--dry-run", "--target", "h200", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "the plan adds 1.60 GiB for the cuDNN workspaces autotuning picks on the device" in text.stdout
    refused = _cli(*base, "--target", "h200", "-o", str(tmp_path / "v.mp4"), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: --target plans for an accelerator that is not here: it needs --dry-run"
    )
    unknown = _cli(*base, "--dry-run", "--target", "a100", cwd=tmp_path)
    assert unknown.returncode == 2 and "known targets: h100, h200" in unknown.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z.safetensors"]


def test_a_machine_without_accelerators_starts_jax_quietly_on_the_cpu():
    code = "import cogvideox_torchax as ct, jax; ct.RuntimeOptions; print(jax.default_backend())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"})
    assert done.returncode == 0 and done.stdout.strip() == "cpu"
    assert done.stderr == "", done.stderr
