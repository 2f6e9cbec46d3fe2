"""The newest accelerators the installed compilers build for without the hardware: TPU v7x and a Blackwell B200.

Each is one record of `cogvideox_torchax.platforms.accelerators` (a row of
`hardware.GPUS` or `hardware.TPUS`); these compile the tiny config's bf16 decode for it.
"""

import pytest

import cogvideox_torchax as ct
from cogvideox_torchax.platforms import accelerators, hardware, hlo
from tests.support.compilers import require_compiler

_TINY = (1, 4, 3, 8, 8)


@pytest.fixture(scope="module")
def tiny_bf16(tiny_upstream):
    return ct.wrap(tiny_upstream, dtype="bfloat16", mesh="dp=1,tp=1", max_memory=None)


def test_v7x_counts_two_tensorcores_per_chip_and_compiles_over_one_chip(tiny_bf16):
    require_compiler("tpu")
    one, host = accelerators.get("v7x-1"), accelerators.get("v7x-4")
    assert (one.devices, host.devices) == (2, 8) and one.topology == host.topology == "tpu7x:2x2x1"
    devices = accelerators.compile_devices("v7x-1")
    assert len(devices) == 2 and {d.device_kind for d in devices} == {"TPU7x"}
    # Both TensorCores of one chip, width split between them (about 25 s on 2 cores).
    compiled = tiny_bf16.compile_decode(_TINY, target="v7x-1", mesh="dp=1,tp=2")
    convs, _ = hlo.compiled_ops(compiled.as_text())
    assert len(convs) >= 60 and {c.dtype for c in convs if c.elements > 4096} == {"bf16"}
    assert 0 < compiled.memory_analysis().temp_size_in_bytes < one.budget


def test_b200_compiles_with_every_convolution_one_fused_cudnn_call(tiny_bf16):
    require_compiler("cuda")
    assert "major: 10 feature_extension: ACCELERATED_FEATURES" in hardware.gpu_target_config("b200")
    compiled = tiny_bf16.compile_decode(_TINY, target="b200")
    convs, _ = hlo.compiled_ops(compiled.as_text())
    assert len(convs) >= 60 and all(c.op == "cudnn-conv" for c in convs)
    assert {c.dim_labels for c in convs} == {"bf012_oi012->bf012"}
    assert 0 < compiled.memory_analysis().temp_size_in_bytes < accelerators.get("b200").budget
