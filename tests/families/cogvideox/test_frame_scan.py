"""The scanned frame-batch loop: upstream's results, a program that does not grow with length."""

import pytest
import torch

import cogvideox_torchax as ct
from cogvideox_torchax.families.cogvideox.patches import frame_scan
from tests.support.parity import assert_close
from tests.support.reference import upstream_decode


def _z(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _ops(vae, shape):
    # Lines of the lowered module: every op once, nested jits (our kernels)
    # as calls; a traced decoder call adds the same number each time.
    return len(vae.lower_decode(shape).as_text().splitlines())


def test_scanned_program_does_not_grow_with_length(tiny_upstream):
    scanned = ct.wrap(tiny_upstream, mesh="dp=1,tp=1")
    unrolled = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=ct.RuntimeOptions(frame_scan=False))
    counts = {t: (_ops(scanned, (1, 4, t, 2, 2)), _ops(unrolled, (1, 4, t, 2, 2))) for t in (5, 9, 13)}
    print(f"[scan] lines of the lowered program, (scanned, unrolled) by latent frames: {counts}")
    # The decoder appears twice when scanned (first batch, scan body) ...
    assert counts[5][0] == counts[9][0] == counts[13][0]
    assert "stablehlo.while" in scanned.lower_decode((1, 4, 9, 2, 2)).as_text()
    # ... and once per frame batch unrolled: 2, 4 and 6 batches.
    assert counts[5][1] < counts[9][1] < counts[13][1]
    per_batch = (counts[13][1] - counts[9][1]) / 2
    # Jitted kernels lower to shared functions called once per use, so a
    # batch adds its calls and glue, not the kernels' bodies (~18 % of the
    # 5-frame program with kernels.causal_conv).
    assert per_batch > 0.1 * counts[5][1]


@pytest.mark.parametrize(
    "options",
    [
        ct.RuntimeOptions(frame_scan=False),  # upstream's loop, caches trimmed
        ct.RuntimeOptions(frame_scan=False, trim_conv_cache=False),  # upstream's loop as is
    ],
    ids=["unrolled", "unrolled-untrimmed"],
)
def test_unrolled_paths_still_match_upstream(tiny_upstream, options):
    z = _z((1, 4, 5, 3, 2), seed=3)
    vae = ct.wrap(tiny_upstream, mesh="dp=1,tp=1", options=options)
    assert_close(vae.decode(z).sample, upstream_decode(tiny_upstream, z), atol=2e-5, label=f"{options}")


def test_scan_needs_trimmed_caches():
    with pytest.raises(ValueError, match="trim_conv_cache"):
        ct.RuntimeOptions(frame_scan=True, trim_conv_cache=False)


def test_apply_frame_scan_rejects_other_modules():
    with pytest.raises(TypeError, match="AutoencoderKLCogVideoX"):
        frame_scan.apply_frame_scan(torch.nn.Linear(2, 2))
