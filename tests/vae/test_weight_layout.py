"""`vae.weight_layout`: a CPU program takes the convolution weights it reads transposed once; no call moves them."""

import re

import jax
import numpy as np
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.vae.program_cache import ProgramKey


@pytest.fixture(scope="module")
def ltx2_tiny_cpu():
    return ct.wrap(ct.random_upstream("ltx2-tiny", seed=0), mesh="dp=1,tp=1")


def _conv_weights(module: torch.nn.Module, prefixes: tuple[str, ...]) -> set[str]:
    return {f"{path}.weight" for path, m in module.named_modules()
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) and path.startswith(prefixes)}


def test_a_cpu_program_takes_the_convolution_weights_of_its_side_transposed(tiny_vae):
    own = tiny_vae.programs.own
    decoding = _conv_weights(own.module, ("decoder.", "post_quant_conv"))
    encoding = _conv_weights(own.module, ("encoder.", "quant_conv"))
    assert decoding and encoding
    for kind in ("decode", "frames"):
        assert own.layout(kind).transposed == decoding
    assert own.layout("encode").transposed == encoding
    # CUDA's plan is channels-first and the TPU's leaves the layout to XLA: upstream's weights as they are.
    for platform in ("cuda", "tpu"):
        assert not tiny_vae.programs.program(ProgramKey(platform)).layout("decode").transposed


def test_the_transposed_weights_are_made_once_and_turn_back_exactly(tiny_upstream, tiny_vae):
    layout = tiny_vae.programs.own.layout("decode")
    laid_out = tiny_vae.programs.weights_for(ProgramKey(), "decode")
    assert laid_out is tiny_vae.programs.weights_for(ProgramKey(), "frames")  # made once, then kept
    state = tiny_upstream.state_dict()
    for name, t in state.items():
        w = laid_out[name]
        if name in layout.transposed:
            o, i, *kernel = t.shape
            assert w.shape == (*kernel, i, o) and w.sharding == tiny_vae.weights[name].sharding
        else:
            assert w is tiny_vae.weights[name]  # the others are upstream's own arrays, not copied
        assert np.array_equal(np.asarray(tiny_vae.weights[name]), t.numpy())  # the VAE's weights stay upstream's
    assert {k: s.shape for k, s in layout.specs(tiny_vae.weights).items()} == {k: w.shape for k, w in laid_out.items()}
    back = jax.jit(layout.to_upstream)(laid_out)
    for name, t in state.items():
        assert np.array_equal(np.asarray(back[name]), t.numpy()), name


def test_no_call_of_the_cpu_decode_moves_a_convolution_weight(ltx2_tiny_cpu):
    # Before: every convolution's weight was transposed inside the program, on every call.
    # LTX-2's decode has no loop. Where a loop reads the weights (CogVideoX's and Wan's frame scans), XLA
    # of jax 0.12 still copies each one (in the order it is held in) before the loop; XLA of jax 0.10 does not.
    vae = ltx2_tiny_cpu
    layout = vae.programs.own.layout("decode")
    text = vae.compile_decode((1, 8, 3, 2, 3)).as_text()
    entry = text[text.index("\nENTRY"):]
    named = re.findall(r"%(\S+) = \S+ parameter\(\d+\).*?op_name=\"weights\[\\'([^\\]+)\\'\]", entry)
    params = {param: name for param, name in named if name in layout.transposed}
    assert set(params.values()) == layout.transposed
    moving = []
    for line in entry.splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = .*? [\w-]+\((.*)\)", line)  # tuple-shaped results too
        if m and ("transpose" in m.group(1) or "copy" in m.group(1)):
            moving += [p for p in re.findall(r"%([\w.\-]+)", m.group(2)) if p in params]
    assert moving == []


def test_wans_time_taps_keep_upstreams_layout():
    # Each tap slices the weight inside Wan's frame loop: transposed, XLA hoisted every tap's kernel out of it.
    vae = ct.wrap(ct.random_upstream("wan-tiny", seed=0), mesh="dp=1,tp=1")
    own = vae.programs.own
    taps = {f"{path}.weight" for path, m in own.module.named_modules() if getattr(m, "keeps_upstream_weight_layout", 0)}
    decoding = _conv_weights(own.module, ("decoder.", "post_quant_conv"))
    assert taps & decoding and own.layout("decode").transposed == decoding - taps
