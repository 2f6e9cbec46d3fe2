"""The library refuses what upstream refuses, as upstream's own error type, and never returns an empty tensor.

Each case runs upstream (eager, CPU) and the wrapped VAE on the same call;
where upstream raises, ours raises an instance of the same type (also a
ValueError, which the commands report as bad input, exit 2) naming the
shape; where upstream answers, ours gives the same shape. Tiny configs.
"""

import numpy as np
import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax import families
from cogvideox_torchax.config import preset_config
from tests.support.upstream_outcomes import assert_as_upstream, outcome

PRESETS = ["tiny", "wan-tiny", "ltx2-tiny"]


@pytest.fixture(scope="module", params=PRESETS)
def pair(request):
    upstream = ct.random_upstream(request.param)
    return upstream, ct.wrap(upstream, mesh="dp=1,tp=1")


def _same(upstream_call, our_call, what):
    expected = assert_as_upstream(upstream_call, our_call, str(tuple(what)))
    if isinstance(expected, Exception):
        assert str(tuple(what)) in str(outcome(our_call))
    return expected


def test_videos_too_small_for_the_encoder_are_refused_as_upstream_refuses_them(pair):
    """Every frame size below one latent pixel, and the first above: an empty latent is never returned."""
    upstream, ours = pair
    refused = 0
    for hw in (1, 2, 3, 5, 7, 8):
        x = torch.rand(1, 3, 1, hw, hw) * 2 - 1
        refused += isinstance(_same(lambda x=x: upstream.encode(x), lambda x=x: ours.encode(x), x.shape), Exception)
    assert refused >= 5


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64, torch.bool, torch.uint8])
def test_latents_and_videos_of_a_kind_upstream_cannot_take_are_refused(pair, dtype):
    """Complex, integer and bool latents, and integer (0..255) videos: upstream's weights take floats only."""
    upstream, ours = pair
    channels = ours.family.latent_channels(ours.config)
    z = (torch.randn(1, channels, 2, 2, 2) * 3).to(dtype)
    _same(lambda: upstream.decode(z), lambda: ours.decode(z), z.shape)
    video = (torch.rand(1, 3, 1, 16, 16) * 255).to(dtype)
    _same(lambda: upstream.encode(video), lambda: ours.encode(video), video.shape)
    with pytest.raises(RuntimeError, match="refuses latents"):  # NumPy's complex too, not its real part
        ours.decode(z.numpy() if dtype != torch.bool else z.numpy().astype(np.complex64))


def test_ltx2_latents_narrower_than_its_reflection_padding_are_refused():
    upstream = ct.random_upstream("ltx2-tiny")
    ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn(1, 8, 1, 1, 1)
    _same(lambda: upstream.decode(z), lambda: ours.decode(z), z.shape)


@pytest.mark.parametrize("temb", ["0.05", [0.05], 0.05, None])
def test_a_timestep_upstream_refuses_is_refused_and_one_left_out_is_the_pipelines_zero(temb):
    """A timestep-conditioned LTX-2 decoder: strings and lists as upstream (TypeError); left out, 0."""
    config = preset_config("ltx2-tiny") | {"timestep_conditioning": True}
    upstream = families.of_config(config).upstream.from_config(config).eval()
    ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    z = torch.randn(1, 8, 2, 2, 2)
    if temb is None:
        assert_equal = ours.decode(z).sample, upstream.decode(z, temb=torch.zeros(1)).sample
        torch.testing.assert_close(*assert_equal, atol=1e-4, rtol=0)  # fp32 tolerance of the parity tests
        return
    expected = _same(lambda: upstream.decode(z, temb), lambda: ours.decode(z, temb), z.shape)
    assert isinstance(expected, TypeError) == isinstance(temb, str | list), expected
