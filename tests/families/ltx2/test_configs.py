"""LTX-2 and LTX-Video configs around the edges of what upstream's constructor takes: run as upstream, or refused alike.

diffusers' own tiny configs (its model tests' and its pipeline tests') and
configs drawn around them (tuple lengths, one-block coders, ratios given or
left out, patch sizes, timestep conditioning, causal coders, upsampling
factors and residuals, padding modes): each decodes and encodes within
1e-4 of upstream in fp32, or fails where upstream fails, with its error
type. Tiny sizes on the CPU.
"""

import random
import warnings

import diffusers
import pytest
import torch
from diffusers import AutoencoderKLLTX2Video

import cogvideox_torchax as ct
from cogvideox_torchax.io import model_files
from tests.support.upstream_outcomes import assert_codes_as_upstream

# diffusers' model tests (tests/models/autoencoders/test_models_autoencoder_ltx2_video.py): no ratios given.
MODEL_TESTS = dict(
    in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
    decoder_block_out_channels=(16, 32, 64), layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
    spatio_temporal_scaling=(True, True, True, True), decoder_spatio_temporal_scaling=(True, True, True),
    decoder_inject_noise=(False, False, False, False),
    downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"), upsample_residual=(True, True, True),
    upsample_factor=(2, 2, 2), timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
    decoder_causal=False, encoder_spatial_padding_mode="zeros", decoder_spatial_padding_mode="zeros",
)
# diffusers' pipeline tests (tests/pipelines/ltx2/test_ltx2.py): one block, an encoder that keeps time, a
# decoder that doubles it (its default upsample_type), one entry of layers_per_block.
PIPELINE_TESTS = dict(
    in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
    layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
    decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
    upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
    encoder_causal=True, decoder_causal=False,
)


def _drawn(seed: int) -> dict:
    """A config around the edges: lengths, kinds, factors and switches drawn from what upstream's constructor reads."""
    rng = random.Random(seed)
    n, m = rng.choice([1, 2, 3]), rng.choice([1, 2, 3])
    width = rng.choice([8, 16])
    config = dict(
        in_channels=3, out_channels=3, latent_channels=rng.choice([4, 8]),
        block_out_channels=tuple([width] * n), layers_per_block=tuple([1] * (n + rng.choice([0, 1]))),
        spatio_temporal_scaling=rng.choice([True, tuple(rng.choice([True, False]) for _ in range(n))]),
        downsample_type=tuple(rng.choice(["spatial", "temporal", "spatiotemporal", "conv"]) for _ in range(n)),
        decoder_block_out_channels=tuple([width * 2] * m), decoder_layers_per_block=tuple([1] * (m + 1)),
        decoder_spatio_temporal_scaling=tuple(rng.choice([True, False]) for _ in range(m)),
        upsample_type=tuple(rng.choice(["spatial", "temporal", "spatiotemporal"]) for _ in range(m)),
        upsample_factor=tuple(rng.choice([1, 2]) for _ in range(m)),
        upsample_residual=rng.choice([False, tuple(rng.choice([True, False]) for _ in range(m))]),
        decoder_inject_noise=False, timestep_conditioning=rng.choice([False, True]),
        patch_size=rng.choice([1, 2]), patch_size_t=1, encoder_causal=rng.choice([True, False]),
        decoder_causal=rng.choice([True, False]),
        decoder_spatial_padding_mode=rng.choice(["reflect", "zeros"]),
    )
    if rng.random() < 0.5:
        config["spatial_compression_ratio"] = rng.choice([4, 8, 16])
        config["temporal_compression_ratio"] = rng.choice([1, 2, 4, 8])
    return config


CASES = {"model-tests": MODEL_TESTS, "pipeline-tests": PIPELINE_TESTS, **{f"drawn-{s}": _drawn(s) for s in range(10)}}


def _drawn_ltx_video(seed: int) -> dict:
    """An `AutoencoderKLLTXVideo` config around the edges: both down block kinds, noise, lengths, ratios."""
    rng = random.Random(100 + seed)
    n, m = rng.choice([1, 2, 3]), rng.choice([1, 2, 3])
    kind = rng.choice(["LTXVideoDownBlock3D", "LTXVideo095DownBlock3D"])
    blocks = n + (1 if kind == "LTXVideo095DownBlock3D" else 0)
    width = rng.choice([8, 16])
    config = dict(
        _class_name="AutoencoderKLLTXVideo", in_channels=3, out_channels=3, latent_channels=rng.choice([4, 8]),
        block_out_channels=tuple([width] * blocks), down_block_types=tuple([kind] * n),
        layers_per_block=tuple([1] * (n + rng.choice([0, 1]))),
        spatio_temporal_scaling=tuple(rng.choice([True, False]) for _ in range(n)),
        downsample_type=tuple(rng.choice(["spatial", "temporal", "spatiotemporal", "conv"]) for _ in range(n)),
        decoder_block_out_channels=tuple([width * 2] * m), decoder_layers_per_block=tuple([1] * (m + 1)),
        decoder_spatio_temporal_scaling=tuple(rng.choice([True, False]) for _ in range(m)),
        decoder_inject_noise=tuple(rng.choice([True, False]) for _ in range(m + 1)),
        upsample_factor=tuple(rng.choice([1, 2]) for _ in range(m)),
        upsample_residual=tuple(rng.choice([True, False]) for _ in range(m)),
        timestep_conditioning=rng.choice([False, True]), patch_size=rng.choice([1, 2]), patch_size_t=1,
        encoder_causal=rng.choice([True, False]), decoder_causal=rng.choice([True, False]),
    )
    if rng.random() < 0.5:
        config["spatial_compression_ratio"] = rng.choice([4, 8, 16])
        config["temporal_compression_ratio"] = rng.choice([1, 2, 4, 8])
    return config


CASES.update({f"ltx-video-drawn-{s}": _drawn_ltx_video(s) for s in range(10)})


@pytest.mark.parametrize("name", list(CASES))
def test_a_config_upstream_builds_runs_as_upstream_runs_it_or_fails_where_it_fails(name):
    config = dict(CASES[name])
    cls = getattr(diffusers, config.pop("_class_name", "AutoencoderKLLTX2Video"))
    torch.manual_seed(0)
    try:
        upstream = cls(**config).eval()
        with torch.no_grad():  # noise injection must show (upstream starts its scales at 0)
            for key, value in upstream.named_parameters():
                if "per_channel_scale" in key:
                    value.fill_(0.3)
    except Exception as e:  # noqa: BLE001  (upstream's constructor refuses it: so does our loader)
        with pytest.raises(ct.ModelLoadError, match="does not build"):
            model_files.check_config({"_class_name": cls.__name__, **config})
        pytest.skip(f"upstream's constructor refuses it ({type(e).__name__}), and so does ours")
    upstream.use_framewise_encoding = upstream.use_framewise_decoding = False  # as diffusers' pipeline tests set it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ratios that disagree with the architecture: upstream's quirk, warned
        ours = ct.wrap(upstream, mesh="dp=1,tp=1")
    assert (ours.spatial_compression_ratio, ours.temporal_compression_ratio) == (
        upstream.spatial_compression_ratio, upstream.temporal_compression_ratio)
    z = torch.randn(1, config["latent_channels"], 2, 3, 3, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    temb = torch.tensor([0.05]) if config["timestep_conditioning"] else None  # as LTX2Pipeline passes it
    assert_codes_as_upstream(upstream, ours, z, x, name, temb)


def test_the_command_decodes_diffusers_pipeline_test_vae_and_says_its_quirks_once_each(tmp_path, capsys):
    """Its folder as save_pretrained writes it, decoded as vae.decode takes latents; each warning one line, once."""
    import numpy as np
    from safetensors.torch import save_file

    from cogvideox_torchax.decode import main as decode

    torch.manual_seed(0)
    upstream = AutoencoderKLLTX2Video(**PIPELINE_TESTS).eval()
    upstream.save_pretrained(tmp_path / "vae")
    z = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(3))
    save_file({"latents": z}, tmp_path / "z.safetensors")
    code = decode([str(tmp_path / "z.safetensors"), "--model", str(tmp_path / "vae"), "--mesh", "dp=1,tp=1",
                   "--no-compile-cache", "--no-unscale", "--output", str(tmp_path / "v.npy")])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [ln[ln.index("warning:"):] for ln in err.replace("\r", "\n").splitlines() if "warning:" in ln]
    assert "UserWarning" not in err and len(lines) == len(set(lines)) == 2, err
    assert all(ln.startswith("warning: AutoencoderKLLTX2Video config: ") for ln in lines), err
    with torch.no_grad():
        expected = upstream.decode(z).sample.numpy()
    assert np.load(tmp_path / "v.npy").shape == expected[0].shape  # one video of the batch per output
