"""`vae.weight_layout`: a CPU program takes the convolution weights it reads transposed once; no call moves them."""

import re

import jax
import numpy as np
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.vae.program_cache import ProgramKey


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


@pytest.mark.parametrize("preset, shape", [
    ("tiny", (1, 4, 3, 4, 6)),
    ("wan-tiny", (1, 16, 3, 4, 6)),  # its time taps each read a slice of the weight
    ("ltx2-tiny", (1, 8, 3, 2, 3)),
])
def test_no_call_of_the_cpu_decode_moves_a_convolution_weight(tiny_vae, preset, shape):
    # Before: every convolution's weight was transposed inside the program, on every call.
    vae = tiny_vae if preset == "tiny" else ct.wrap(ct.random_upstream(preset, seed=0), mesh="dp=1,tp=1")
    layout = vae.programs.own.layout("decode")
    text = vae.compile_decode(shape).as_text()
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
