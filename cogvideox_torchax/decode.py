"""``python -m cogvideox_torchax.decode LATENTS``: decode latents to frames.

A thin command line over the library. Latents are read from a safetensors
file in the layout `vae.decode` takes, ``(B, C, T, H, W)``, already divided by
the scaling factor. The decoded video is written as raw frames (``.npy`` or
``.safetensors``, float, ``(B, 3, F, 8H, 8W)``); a timing summary follows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RANDOM_PREFIX = "random:"
OUTPUT_SUFFIXES = (".npy", ".safetensors")


class UsageError(Exception):
    """Bad input; reported as one line with exit code 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cogvideox_torchax.decode", description=__doc__.splitlines()[0])
    p.add_argument("latents", help="safetensors file holding the latents (B, C, T, H, W)")
    p.add_argument("--key", help="tensor to decode when the file holds several")
    p.add_argument(
        "--model",
        default="THUDM/CogVideoX-2b",
        help="local diffusers folder, hub id, or random:cogvideox-2b / random:cogvideox-5b / random:tiny "
        "(seeded random weights, no download); default THUDM/CogVideoX-2b",
    )
    p.add_argument("--subfolder", default=None, help="VAE folder inside --model (default 'vae' for hub ids)")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16 (fp32/bf16)")
    p.add_argument("--mesh", default=None, help="device mesh, e.g. dp=1,tp=8 (default: all devices on tp)")
    p.add_argument("--seed", type=int, default=0, help="seed for random: models")
    p.add_argument("--output", "-o", required=True, help="output file: .npy or .safetensors")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _read_latents(path: Path, key: str | None) -> np.ndarray:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if not path.is_file():
        raise UsageError(f"no such latents file: {str(path)!r}")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{str(path)!r} is not a readable safetensors file: {e}") from e
    if not tensors:
        raise UsageError(f"{str(path)!r} holds no tensors")
    if key is None:
        if len(tensors) > 1:
            raise UsageError(f"{str(path)!r} holds several tensors; pick one with --key: {', '.join(sorted(tensors))}")
        (z,) = tensors.values()
    elif key not in tensors:
        raise UsageError(f"no tensor {key!r} in {str(path)!r}; keys: {', '.join(sorted(tensors))}")
    else:
        z = tensors[key]
    if not np.isfinite(z.astype(np.float32)).all():
        raise UsageError(f"latents in {str(path)!r} contain NaN or Inf")
    return z


def _check_output(path: Path, overwrite: bool) -> None:
    if path.suffix not in OUTPUT_SUFFIXES:
        raise UsageError(f"unknown output extension {path.suffix!r}; use one of {', '.join(OUTPUT_SUFFIXES)}")
    if path.exists() and not overwrite:
        raise UsageError(f"output {str(path)!r} exists; pass --overwrite to replace it")
    if not path.parent.is_dir():
        raise UsageError(f"output folder {str(path.parent)!r} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"output folder {str(path.parent)!r} is not writable")


def _load_model(args: argparse.Namespace):
    import cogvideox_torchax as ct

    if args.model.startswith(RANDOM_PREFIX):
        preset = args.model[len(RANDOM_PREFIX) :]
        try:
            module = ct.random_upstream(preset, seed=args.seed)
        except ValueError as e:
            raise UsageError(str(e)) from e
        return ct.wrap(module, dtype=args.dtype, mesh=args.mesh)
    subfolder = args.subfolder
    if subfolder is None and not Path(args.model).exists():
        subfolder = "vae"
    return ct.from_pretrained(args.model, subfolder=subfolder, dtype=args.dtype, mesh=args.mesh)


def _write(path: Path, frames: np.ndarray) -> None:
    # Written beside the destination and renamed: a failed or interrupted run
    # never leaves a half-written output.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        if path.suffix == ".npy":
            np.save(tmp, frames)
        else:
            from safetensors.numpy import save_file

            save_file({"video": np.ascontiguousarray(frames)}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def run(args: argparse.Namespace) -> dict:
    """Decodes as the parsed arguments say and returns the timing summary."""
    from cogvideox_torchax.config import canonical_dtype

    output = Path(args.output)
    _check_output(output, args.overwrite)
    try:
        canonical_dtype(args.dtype)
    except ValueError as e:
        raise UsageError(str(e)) from e
    z = _read_latents(Path(args.latents), args.key)

    import jax

    t0 = time.perf_counter()
    vae = _load_model(args)
    try:
        vae.check_latents(z.shape)
    except ValueError as e:
        raise UsageError(str(e)) from e
    t1 = time.perf_counter()
    vae.compile_decode(z.shape)
    t2 = time.perf_counter()
    video = jax.block_until_ready(vae.decode_jax(z))
    t3 = time.perf_counter()
    frames = np.asarray(video.astype(jax.numpy.float32))
    _write(output, frames)
    t4 = time.perf_counter()
    n_frames = frames.shape[0] * frames.shape[2]
    return {
        "output": str(output),
        "latents_shape": list(z.shape),
        "video_shape": list(frames.shape),
        "dtype": vae.options.dtype,
        "mesh": dict(vae.mesh.shape),
        "device": str(jax.devices()[0].device_kind),
        "load_s": round(t1 - t0, 3),
        "compile_s": round(t2 - t1, 3),
        "decode_s": round(t3 - t2, 3),
        "write_s": round(t4 - t3, 3),
        "frames_per_s": round(n_frames / (t3 - t2), 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        summary = run(args)
    except Exception as e:  # one line for the user; the traceback with --debug
        if args.debug:
            raise
        from cogvideox_torchax.loading import ModelLoadError

        known = isinstance(e, (UsageError, ModelLoadError, ValueError))
        print(f"error: {e}" if known else f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2 if known else 1
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"decoded {summary['latents_shape']} -> {summary['video_shape']} ({summary['dtype']}, "
            f"mesh {summary['mesh']}, {summary['device']})"
        )
        print(
            f"  load {summary['load_s']:.2f} s | compile {summary['compile_s']:.2f} s | "
            f"decode {summary['decode_s']:.2f} s ({summary['frames_per_s']:.2f} frames/s) | "
            f"write {summary['write_s']:.2f} s"
        )
        print(f"  wrote {summary['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
