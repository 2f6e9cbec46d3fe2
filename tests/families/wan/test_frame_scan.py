"""Wan's chunk loops as one scan: a program that does not grow with the video; eager, the patch is upstream's."""

import re

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.families.wan.patches.frame_scan import apply_frame_scan
from tests.support.parity import assert_close
from tests.support.reference import seeded_latents


def _program(vae, kind, shape):
    """(convolutions and calls of the program's text, while loops): its size whatever it nests."""
    text = vae.lower_decode(shape).as_text() if kind == "decode" else vae.lower_encode(shape).as_text()
    return len(re.findall(r"stablehlo\.convolution|call @", text)), text.count("stablehlo.while")


def test_the_decode_and_encode_programs_do_not_grow_with_length(wan_tiny):
    # The decoder is traced twice (first frame, one scan step) whatever the length.
    short, long = _program(wan_tiny, "decode", (1, 16, 3, 2, 2)), _program(wan_tiny, "decode", (1, 16, 11, 2, 2))
    assert short == long and short[1] == 1
    assert _program(wan_tiny, "encode", (1, 3, 9, 8, 8)) == _program(wan_tiny, "encode", (1, 3, 41, 8, 8))


def test_without_the_scan_the_loop_is_unrolled(wan_tiny_upstream):
    off = ct.wrap(wan_tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(wan_frame_scan=False))
    assert "wan_frame_scan" not in off.plan.steps
    three, five = _program(off, "decode", (1, 16, 3, 2, 2)), _program(off, "decode", (1, 16, 5, 2, 2))
    assert three[0] < five[0] and five[1] == 0
    # ... and, unpatched, still upstream's result.
    z = seeded_latents((1, 16, 3, 2, 2))
    with torch.no_grad():
        expected = wan_tiny_upstream.decode(z).sample
    assert_close(off.decode(z).sample, expected, atol=1e-5, label="wan-tiny, upstream's loop unrolled")


def test_the_patched_module_runs_eagerly_as_upstream(wan_tiny_upstream):
    import copy

    patched = copy.deepcopy(wan_tiny_upstream)
    assert apply_frame_scan(patched) == 1 and apply_frame_scan(patched) == 0
    z = seeded_latents((1, 16, 3, 2, 3))
    x = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    with torch.no_grad():
        assert torch.equal(patched.decode(z).sample, wan_tiny_upstream.decode(z).sample)
        assert torch.equal(patched.encode(x).latent_dist.mean, wan_tiny_upstream.encode(x).latent_dist.mean)


def test_another_family_is_refused(tiny_upstream):
    with pytest.raises(TypeError, match="AutoencoderKLWan"):
        apply_frame_scan(tiny_upstream)
