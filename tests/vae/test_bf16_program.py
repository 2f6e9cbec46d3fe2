"""The whole bf16 decode, lowered: no activation-sized fp32 value outside a fused computation."""

import cogvideox_torchax as ct
from tests.support import stablehlo_rules as hlo


def _escapes(options):
    vae = ct.wrap(ct.random_upstream("tiny", seed=0), mesh="dp=1,tp=1", options=options)
    shape = (1, 4, 5, 4, 4)  # first batch + one scan step; both upsamplers and every SpatialNorm
    text = vae.lower_decode(shape).as_text()
    assert "xbf16>" in text
    # Full-size means at least an activation after the first 2x upsampling
    # (8 channels here): anything fp32 that big must be inside a reduction
    # or an elementwise chain cast back to bf16. Latent-resolution fp32
    # values are allowed: SpatialNorm's scale and shift are computed in fp32
    # from the latent on purpose (spatial_norm.LowResSpatialNorm3D).
    batch, _, frames, height, width = shape
    return hlo.fp32_escapes(text, min_elements=batch * 8 * frames * (2 * height) * (2 * width))


def test_bf16_decode_keeps_no_full_size_fp32():
    escapes = _escapes(ct.RuntimeOptions(dtype="bfloat16"))
    assert not escapes, "activation-sized f32 values escape a fused computation:\n" + "\n".join(escapes[:10])


def test_the_check_sees_torchax_interpolation_upcast():
    # Without our nearest kernel, torchax's fallback gathers from an fp32
    # copy of each upsampled activation; the check must say so.
    escapes = _escapes(ct.RuntimeOptions(dtype="bfloat16", nearest_upsample=False))
    assert any("gather" in e for e in escapes), escapes[:5]
