"""Reading and writing latents in safetensors files; their two layouts and CogVideoX's scaling.

People hold latents in two layouts: ``(B, C, T, H, W)`` as ``vae.decode``
takes them (and Wan's pipelines hold them), and ``(B, T, C, H, W)`` as
``CogVideoXPipeline(..., output_type="latent")`` returns them.
`prepare` undoes CogVideoX's scaling; what each model family's pipelines
hold, and the checks of a file's origin, are
`cogvideox_torchax.io.family_latents`'.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from cogvideox_torchax.io import paths

LAYOUTS = ("auto", "BCTHW", "BTCHW")


class LatentsError(ValueError):
    """Latents that cannot be read or decoded; the message says why."""


def read_latents(path: str | os.PathLike, key: str | None = None) -> np.ndarray:
    """Reads one tensor from a safetensors file as float32.

    fp16, bf16 and fp32 tensors are accepted (bf16 through torch, which numpy
    cannot represent); the values are widened exactly.

    Args:
        path: the safetensors file.
        key: which tensor, when the file holds several.

    Raises:
        LatentsError: missing or unreadable file, no tensors, several and no
            ``key``, an unknown ``key``, a tensor that is not float16, bfloat16,
            float32 or float64, NaN or Inf, values beyond float32's range.
    """
    import torch
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    problem = paths.not_a_file(path)  # never opened otherwise: a FIFO would block
    if problem == "does not exist":
        raise LatentsError(f"no such latents file: {str(path)!r}")
    if problem is not None:
        raise LatentsError(f"{str(path)!r} {problem}{', not a latents file' if problem == 'is a folder' else ''}")
    check_header(path)
    try:
        # By the path's bytes: safe_open refuses a name that is not UTF-8.
        with paths.by_bytes(path) as name, safe_open(name, framework="pt") as f:
            keys = sorted(f.keys())
            if not keys:
                raise LatentsError(f"{str(path)!r} holds no tensors")
            if key is None:
                if len(keys) > 1:
                    raise LatentsError(f"{str(path)!r} holds several tensors; pick one with --key: {', '.join(keys)}")
                key = keys[0]
            elif key not in keys:
                raise LatentsError(f"no tensor {key!r} in {str(path)!r}; keys: {', '.join(keys)}")
            tensor = f.get_tensor(key)
    except LatentsError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError, KeyError) as e:
        raise LatentsError(f"{str(path)!r} is not a readable safetensors file: {e}") from e
    if tensor.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise LatentsError(f"latents {key!r} in {str(path)!r} are {tensor.dtype}, not float16, bfloat16, float32 or float64")
    # Checked in the file's own dtype: a float64 value beyond float32's range
    # is out of range, not "Inf".
    if tensor.numel() and not bool(torch.isfinite(tensor).all()):
        raise LatentsError(f"latents {key!r} in {str(path)!r} contain NaN or Inf")
    if tensor.numel():
        largest = float(tensor.abs().max().to(torch.float64))
        if largest > FLOAT32_MAX:
            raise LatentsError(
                f"latents {key!r} in {str(path)!r} hold values up to {largest:.3g}, out of range for "
                f"float32 (largest {FLOAT32_MAX:.3g}), the widest dtype the decode computes in"
            )
    return tensor.to(torch.float32).numpy()


FLOAT32_MAX = float(np.finfo(np.float32).max)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string pairs a safetensors file's header holds (``__metadata__``), its header checked (`check_header`)."""
    return check_header(path)

# The safetensors format's dtypes and their sizes in bits (the crate's `Dtype`).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
HEADER_LIMIT = 100_000_000  # the crate's largest header


def check_header(path: str | os.PathLike) -> dict[str, str]:
    """Refuses a safetensors file whose header is not well formed by the format's rules, reading only the header.

    Returns the header's ``__metadata__`` (string pairs; empty if none).

    The rules (as the safetensors crate states them): 8 bytes, the header's
    length N (little-endian u64, at most 100 MB, within the file); N bytes of
    UTF-8 JSON, an object, with no key twice; ``__metadata__``, if there, a
    map of strings to strings; every other entry ``{"dtype", "shape",
    "data_offsets"}`` with a known dtype, a shape of non-negative integers
    and offsets ``[begin, end]`` whose span is the tensor's size; and the
    tensors together cover the data section exactly: no overlap, no hole,
    nothing after the last.

    Raises:
        LatentsError: naming the file and what is wrong.
    """
    import json

    def bad(what: str) -> LatentsError:
        return LatentsError(f"{str(path)!r} is not a readable safetensors file (malformed header): {what}")

    problem = paths.not_a_file(path)  # looked at before it is opened: a FIFO would block the read
    if problem:
        raise LatentsError(f"{str(path)!r} {problem}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > HEADER_LIMIT:
                raise bad(f"header length {n} is over the format's limit of {HEADER_LIMIT} bytes")
            if 8 + n > size:
                raise bad(f"header length {n} runs past the end of the file ({size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise LatentsError(f"{str(path)!r} cannot be read: {e.strerror or e}") from e

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) < len(pairs):  # linear: a header may name a great many tensors
            seen: set[str] = set()
            twice = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise bad(f"the header names {twice!r} twice")
        return found

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        if isinstance(e, LatentsError):
            raise
        raise bad(f"the header is not UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad(f"the header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("__metadata__ is not a map of strings to strings")
    data = size - 8 - n
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor {name!r} is not {{dtype, shape, data_offsets}}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SAFETENSORS_BITS:
            raise bad(f"tensor {name!r} has dtype {dtype!r}, not one of the format's")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise bad(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets)
                or offsets[0] > offsets[1]):
            raise bad(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end")
        bits = SAFETENSORS_BITS[dtype] * int(np.prod(shape, dtype=object))
        if bits % 8 or offsets[1] - offsets[0] != bits // 8:
            raise bad(f"tensor {name!r} of {dtype} {shape} takes {bits / 8:g} bytes, "
                      f"but its data_offsets {offsets} span {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            what = "overlaps the tensor before it" if begin < end else f"leaves a hole of {begin - end} bytes before it"
            raise bad(f"tensor {name!r} at data_offsets [{begin}, {stop}] {what}")
        end = stop
    if end > data:
        raise bad(f"the tensors need {end} bytes of data but the file holds {data}")
    if end < data:
        raise bad(f"{data - end} bytes after the last tensor's data (the format allows none)")
    return metadata


def check_range(z: np.ndarray, dtype: str, *, unscaled_by: float | None = None, after: str | None = None) -> None:
    """Raises `LatentsError` unless every value of ``z`` is finite and representable in ``dtype``.

    Args:
        z: the latents the decode will be given (after unscaling).
        dtype: the compute dtype, ``"float32"``, ``"bfloat16"`` or ``"float16"`` (largest 65504).
        unscaled_by: the scaling factor they were divided by, for the message.
        after: what was done to them otherwise, for the message (``"after ..."``).
    """
    import jax.numpy as jnp

    limit = float(jnp.finfo(jnp.dtype(dtype)).max)
    after = f" {after}" if after else ""
    if unscaled_by is not None:
        after = f" after dividing by the scaling factor {unscaled_by:g}"
    if not np.isfinite(z).all():
        raise LatentsError(f"latents overflow to Inf{after}; they are out of range for {dtype}")
    largest = float(np.abs(z).max()) if z.size else 0.0
    if largest > limit:
        raise LatentsError(
            f"latents hold values up to {largest:.3g}{after}, out of range for {dtype} (largest {limit:.3g})"
        )


def check_shape(shape: tuple[int, ...]) -> None:
    """Raises `LatentsError` unless ``shape`` is 5-D with no empty dimension."""
    shape = tuple(shape)
    if len(shape) != 5:
        raise LatentsError(f"latents must be 5-D, (B, C, T, H, W) or (B, T, C, H, W); got shape {shape}")
    if min(shape) < 1:
        raise LatentsError(f"latents have an empty dimension: shape {shape}")


def detect_layout(shape: tuple[int, ...], latent_channels: int, layout: str = "auto") -> str:
    """Which layout a 5-D latent shape is in, from the model's channel count.

    Args:
        shape: the latents' shape.
        latent_channels: the model's ``config.latent_channels``.
        layout: ``"auto"``, or ``"BCTHW"`` / ``"BTCHW"`` to insist.

    Returns:
        ``"BCTHW"`` or ``"BTCHW"``.

    Raises:
        LatentsError: not 5-D, an empty dimension, no dimension matching the
            channel count, or both matching under ``"auto"`` (ambiguous).
    """
    if layout not in LAYOUTS:
        raise LatentsError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    shape = tuple(shape)
    check_shape(shape)
    c_first, c_second = shape[1] == latent_channels, shape[2] == latent_channels
    if layout == "BCTHW" and not c_first:
        raise LatentsError(f"layout BCTHW needs {latent_channels} channels in dim 1; got shape {shape}")
    if layout == "BTCHW" and not c_second:
        raise LatentsError(f"layout BTCHW needs {latent_channels} channels in dim 2; got shape {shape}")
    if layout != "auto":
        return layout
    if c_first and c_second:
        raise LatentsError(
            f"latents shape {shape} is ambiguous: dims 1 and 2 both equal the model's {latent_channels} "
            "channels; pass --layout BCTHW or --layout BTCHW"
        )
    if not (c_first or c_second):
        raise LatentsError(
            f"latents shape {shape} has no dimension with the model's {latent_channels} channels "
            "(expected (B, C, T, H, W) or (B, T, C, H, W))"
        )
    return "BCTHW" if c_first else "BTCHW"


def prepare(
    z: np.ndarray, latent_channels: int, scaling_factor: float, *, layout: str = "auto", unscale: bool = True
) -> tuple[np.ndarray, str]:
    """Latents in either layout → ``(B, C, T, H, W)`` as `decode` takes them.

    Args:
        z: latents, 5-D.
        latent_channels: the model's ``config.latent_channels``.
        scaling_factor: the model's ``config.scaling_factor``.
        layout: as `detect_layout`.
        unscale: divide by ``scaling_factor`` as the pipeline does before
            decoding; False for latents already divided.

    Returns:
        The latents ready for `TorchaxVAE.decode`, and the layout they came in.
    """
    found = detect_layout(z.shape, latent_channels, layout)
    if found == "BTCHW":
        z = np.transpose(z, (0, 2, 1, 3, 4))
    z = np.ascontiguousarray(z, dtype=np.float32)
    if unscale:
        # As the pipeline writes it: latents * (1 / scaling_factor).
        z = z * np.float32(1.0 / scaling_factor)
    return z, found


def write_latents(
    path: str | os.PathLike,
    z: np.ndarray,
    *,
    key: str = "latents",
    metadata: dict[str, str] | None = None,
    overwrite: bool = False,
) -> None:
    """Writes one float32 tensor to a safetensors file, staged (see `cogvideox_torchax.io.outputs.StagedOutputs`).

    Args:
        path: the ``.safetensors`` file.
        z: the latents.
        key: the tensor's name.
        metadata: string pairs stored in the file's header (safetensors'
            ``__metadata__``), e.g. the layout and scaling factor.
        overwrite: replace an existing file (never a folder).
    """
    from cogvideox_torchax.io.outputs import atomic_output

    with atomic_output(Path(path), overwrite=overwrite) as tmp:
        save_latents_file(tmp, z, key=key, metadata=metadata)


def save_latents_file(
    dest: str | os.PathLike, z: np.ndarray, *, key: str = "latents", metadata: dict[str, str] | None = None
) -> None:
    """Writes one float32 tensor at ``dest`` itself (no staging; the command line stages it)."""
    from safetensors.numpy import save_file

    save_file({key: np.ascontiguousarray(z, dtype=np.float32)}, str(dest), metadata=metadata)
