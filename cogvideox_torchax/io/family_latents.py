"""Latents as a model family's pipelines hold them, to and from what its ``vae.decode`` takes; a file's origin.

CogVideoX's pipelines hold latents ``(B, T, C, H, W)`` times
``config.scaling_factor``; Wan's ``(B, C, T, H, W)`` normalised per channel
by ``latents_mean`` and ``latents_std``. The family record
(`cogvideox_torchax.families`) says which; this module applies it for the
commands, and refuses latents whose file metadata or layout say they are
another family's (16 channels either way, so the channel count alone
cannot tell).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cogvideox_torchax import families
from cogvideox_torchax.io import latents
from cogvideox_torchax.io.latents import LatentsError, check_range, check_shape, detect_layout


def _layout(family: families.Family, shape: tuple[int, ...], channels: int, layout: str) -> str:
    if layout != "auto" or family.pipeline_layout == "BTCHW":
        return detect_layout(shape, channels, layout)
    # Its pipelines hold (B, C, T, H, W), as vae.decode takes them: that is the layout.
    check_shape(shape)
    if shape[1] == channels:
        return "BCTHW"
    if shape[2] == channels:
        others = [f.title for f in families.FAMILIES.values() if f.pipeline_layout == "BTCHW"]
        raise LatentsError(
            f"latents shape {shape} has the model's {channels} channels in dim 2, (B, T, C, H, W), as "
            f"{' and '.join(others)}'s pipelines hold latents; {family.title}'s pipelines and vae.decode hold "
            f"(B, C, T, H, W): decode them with a {' or '.join(others)} model, or pass --layout BTCHW if they are "
            f"{family.title} latents laid out so"
        )
    raise LatentsError(f"latents shape {shape} has no dimension with the model's {channels} channels "
                       "(expected (B, C, T, H, W))")


def prepare_for(vae: Any, z: np.ndarray, *, layout: str = "auto", unscale: bool = True) -> tuple[np.ndarray, str]:
    """Latents as ``vae``'s family's pipelines hold them -> ``(B, C, T, H, W)`` as its decode takes them, checked.

    Args:
        vae: the `TorchaxVAE` (its family and config).
        z: latents, 5-D, in either layout.
        layout: ``"auto"`` (the family's: `_layout`), ``"BCTHW"`` or ``"BTCHW"``.
        unscale: undo the pipeline's scaling (`families.Family.from_pipeline`);
            False for latents already as ``vae.decode`` takes them.

    Returns:
        The latents ready for ``vae``'s decode, and the layout they came in.

    Raises:
        ValueError: a shape the VAE cannot decode; `LatentsError`: another
            family's layout, values out of range for the VAE's dtype.
    """
    family, config = vae.family, vae.config
    found = _layout(family, tuple(z.shape), family.latent_channels(config), layout)
    if found == "BTCHW":
        z = np.transpose(z, (0, 2, 1, 3, 4))
    z = np.ascontiguousarray(z, dtype=np.float32)
    if unscale:
        z = np.ascontiguousarray(family.from_pipeline(z, family.normalization_source(vae)), dtype=np.float32)
    vae.check_latents(z.shape)
    check_range(z, vae.options.dtype, after=family.unscaled_phrase(config) if unscale else None)
    return z, found


def read_for(vae: Any, path: str, key: str | None, *, layout: str = "auto", unscale: bool = True,
             read: tuple[np.ndarray, Mapping[str, str]] | None = None) -> tuple[np.ndarray, str, list[str]]:
    """A latents file as ``vae``'s decode takes them (`prepare_for`): ``(z, layout, warnings)``.

    ``read``: the file's latents and metadata, read already. A file another
    family's pipelines wrote is refused; one that only may be is a warning
    (`check_origin`).
    """
    if read is None:
        z = latents.read_latents(path, key)
        check_shape(z.shape)
        read = (z, latents.read_metadata(path))
    warnings = check_origin(vae, read[1] or {}, repr(path))
    z, layout = prepare_for(vae, read[0], layout=layout, unscale=unscale)
    return z, layout, warnings


def to_pipeline(vae: Any, z: np.ndarray) -> tuple[np.ndarray, str]:
    """Encoder latents ``(B, C, T, H, W)`` -> as ``vae``'s family's pipelines hold them, and that layout.

    The inverse of `prepare_for` with its defaults, so the decode command
    reads the result back with no flags; the image-to-video pipelines
    scale their image latents the same way.
    """
    if z.ndim != 5:
        raise LatentsError(f"latents must be (B, C, T, H, W), got shape {tuple(z.shape)}")
    family = vae.family
    held = family.to_pipeline(np.asarray(z, dtype=np.float32), family.normalization_source(vae))
    if family.pipeline_layout == "BTCHW":
        held = np.transpose(held, (0, 2, 1, 3, 4))
    return np.ascontiguousarray(held, dtype=np.float32), family.pipeline_layout


def metadata_for(vae: Any, layout: str) -> dict[str, str]:
    """What a latents file written for ``vae`` records of its origin: the model, the layout, the scaling."""
    family = vae.family
    return {"model": family.class_name, "layout": layout,
            **family.normalization_metadata(family.normalization_source(vae))}


def check_origin(vae: Any, metadata: Mapping[str, str], source: str) -> list[str]:
    """Refuses latents whose file metadata says they are another model family's; returns warnings of other mismatches.

    ``metadata`` is the file's (`latents.read_metadata`): the ``model``
    class, or the scaling a family records (CogVideoX ``scaling_factor``,
    Wan ``latents_mean`` / ``latents_std``), that the encode command
    writes. A value of this family's scaling that differs from the model's
    is a warning (a sibling checkpoint, e.g. CogVideoX-2b's latents on the
    5b VAE), not an error.

    Raises:
        LatentsError: naming what the metadata says and what the model is.
    """
    family = vae.family
    claimed = metadata.get("model")
    others = [f for f in families.FAMILIES.values() if f is not family]
    suggested = [f for f in others if claimed == f.class_name]
    if claimed is None and not any(k in metadata for k in family.metadata_keys):
        # Told apart by the scaling they record: every key of a family's (CogVideoX's
        # scaling_factor alone, not LTX-2's statistics beside it), else any.
        suggested = ([f for f in others if all(k in metadata for k in f.metadata_keys)]
                     or [f for f in others if any(k in metadata for k in f.metadata_keys)])
    if suggested or (claimed is not None and claimed != family.class_name):
        what = f"'model': {claimed!r}" if claimed else ", ".join(
            f"{k!r}" for k in dict.fromkeys(k for f in suggested for k in f.metadata_keys if k in metadata))
        origin = suggested[0].title if suggested else claimed
        raise LatentsError(
            f"{source}: its metadata ({what}) says these are {origin} latents; the model is "
            f"{family.title}'s {family.class_name} ({family.normalization}): decode them with a {origin} model"
        )
    expected = family.normalization_metadata(family.normalization_source(vae))
    return [f"{source}: its metadata's {k} is {metadata[k]}, the model's {v}; decoding with the model's"
            for k, v in expected.items() if k in metadata and metadata[k] != v]


def frame_size(vae: Any, shape: tuple[int, ...]) -> tuple[int, int]:
    """The decoded frames' ``(height, width)`` for latents of ``shape`` (last two dims H, W)."""
    scale = vae.family.spatial_scale(vae.config)
    return scale * shape[-2], scale * shape[-1]


def frames_of(vae: Any, latent_frames: int) -> int:
    """How many video frames ``latent_frames`` latent frames decode to (the family's rule)."""
    return vae.family.frames_of(vae.config, latent_frames)
