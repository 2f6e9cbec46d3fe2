"""LTX-Video 0.9's VAE (`AutoencoderKLLTXVideo`: releases 0.9.0 to 0.9.7), LTX-2's predecessor and its model.

LTX-2's VAE was written from this one, and upstream decodes it the same
way: the whole video in one call, no frame loop, no cache, the decode
timestep of a timestep-conditioned decoder (0.9.1 and later) as
``decode(z, temb)``, latents normalised by the ``latents_mean`` and
``latents_std`` buffers. What differs is told by the config and the
upstream class: its blocks (`config_check`), its modules (diffusers'
`RMSNorm` over channels moved last, no padding modes) and 0.9.1's noise
injection, which upstream draws from torch's generator on every decode
and this package draws as upstream does
(`cogvideox_torchax.vae.drawn_noise`). Its pipelines
(``LTXPipeline`` and its siblings) hold latents as LTX-2's do and run at 25
frames per second.
"""

from __future__ import annotations

from cogvideox_torchax.families.ltx2 import LTX2Video
from cogvideox_torchax.families.ltx2.presets import LTX_VIDEO_PRESETS


class LTXVideo(LTX2Video):
    """`AutoencoderKLLTXVideo` (LTX-Video 0.9.x)."""

    name = "ltx-video"
    title = "LTX-Video"
    class_name = "AutoencoderKLLTXVideo"
    presets = LTX_VIDEO_PRESETS
    default_model = "Lightricks/LTX-Video"
    # LTXPipeline's frame_rate.
    fps = 25.0

    def sharded_outputs(self) -> tuple[type, ...]:
        from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoCausalConv3d, LTXVideoUpsampler3d
        from diffusers.models.normalization import RMSNorm

        return (LTXVideoCausalConv3d, RMSNorm, LTXVideoUpsampler3d)


LTX_VIDEO = LTXVideo()

__all__ = ["LTX_VIDEO", "LTXVideo"]

