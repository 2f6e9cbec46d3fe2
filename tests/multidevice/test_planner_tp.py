"""The memory planner's last resort: the whole decode on a mesh with more devices on tp.

Run on 8 simulated CPU devices (tests/test_multidevice.py). A VAE built on
one of them, with a budget that neither its whole decode nor any tiling
fits, decodes on more devices, as the one-device decode (fp32, 1e-5).
"""

import jax
import pytest
import torch

import cogvideox_torchax as ct
from tests.support.parity import assert_close

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")

SHAPE = (1, 4, 2, 6, 40)  # four tilings (down to 7.4 MB), then tp=8 at 7.0 MB


@pytest.fixture
def compile_cache(tmp_path):
    # The planning VAE compiles the probe's candidates again: from the cache, in a fraction of the time.
    from cogvideox_torchax.vae import compile_cache

    compile_cache.enable_compile_cache(tmp_path / "cache")
    yield
    compile_cache.disable_compile_cache()


def test_planner_moves_to_more_devices_on_tp_when_tiles_do_not_fit(tiny_upstream, compile_cache):
    probe = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    candidates = probe.memory_candidates(SHAPE)
    names = [c.name for c in candidates]
    assert names[0] == "whole" and names[-3:] == ["whole on dp=1,tp=2", "whole on dp=1,tp=4", "whole on dp=1,tp=8"]
    one_device = [c.bytes for c in candidates if c.mesh is None]
    tp8 = candidates[-1]
    assert len(one_device) == 5 and tp8.mesh == (1, 8) and tp8.bytes < min(one_device)  # else no such budget
    assert not probe.programs.copied_to()  # planning traces other meshes from shapes: no weight copies made
    budget_bytes = int((min(one_device) - 1) / 0.9)  # below every one-device plan, margin included
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", max_memory=budget_bytes)
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3))
    got = vae.decode(z).sample
    plan = vae.planned(SHAPE)
    assert plan.mesh is not None and plan.mesh[1] > 1 and plan.name.startswith("whole on dp=1,tp=")
    assert dict(vae.mesh.shape) == {"dp": 1, "tp": 1}  # the VAE's own mesh is unchanged
    assert_close(got, probe.decode(z).sample, atol=1e-5, label=f"planned {plan.name} vs one device")
    assert vae.programs.copied_to() == [plan.mesh]  # only the chosen mesh got the weights
    vae.clear_compiled()
    assert not vae.programs.copied_to()
