"""What every bench command is given: the model and its family, the latent shapes, the options.

Nothing here or in the commands tests a class name: what differs between
model families (latent and video channels, frame rules, which switches
loop over frames) is read from the model's `cogvideox_torchax.families`
record.
"""

from __future__ import annotations

import argparse
from typing import Any

SWEEP_DEFAULTS = {"frames": "1,3,5,9", "resolution": "8,16,24,32"}
# The Flax NNX port (bench/flax_vae.py) is CogVideoX's decoder alone: for
# another family's model the Flax system is not run, and the report says so.
FLAX_PORT_FAMILIES = frozenset({"cogvideox"})
RANDOM = "random:"


def family_of_model(model: str):
    """The `cogvideox_torchax.families.Family` of ``--model``, read without building it (torch and JAX not imported).

    ``random:PRESET``: the preset's family; a local diffusers folder: its
    ``config.json``'s ``_class_name``.
    """
    from cogvideox_torchax import families

    if model.startswith(RANDOM):
        try:
            return families.of_preset(model[len(RANDOM) :])
        except ValueError as e:
            raise SystemExit(f"error: --model {model}: {e}") from None
    from cogvideox_torchax.io import model_files

    try:
        return model_files.family_of(model_files.read_config(model_files.resolve_model_dir(model)))
    except model_files.ModelLoadError as e:
        raise SystemExit(f"error: --model {model}: {e}") from None


def load_upstream(model: str, seed: int):
    """The upstream module of ``--model``: ``random:PRESET`` (seeded weights) or a local diffusers folder (its
    family's class)."""
    import cogvideox_torchax as ct

    if model.startswith(RANDOM):
        return ct.random_upstream(model[len(RANDOM) :], seed=seed)
    return family_of_model(model).upstream.from_pretrained(model).eval()


def family(upstream: Any):
    """The family record of an upstream module."""
    from cogvideox_torchax import families

    return families.of_module(upstream)


def decode_args(upstream: Any, z: Any) -> tuple:
    """What upstream's decode takes after ``z``, as this package passes it when left out: torch tensors like ``z``.

    LTX's timestep-conditioned decoders take the decode timestep (0, their
    pipelines' default); other families' decodes take nothing more.
    """
    import torch

    values = family(upstream).decode_input_values(upstream.config, z.shape[0], {})
    return tuple(torch.as_tensor(v, device=z.device, dtype=z.dtype) for v in values)


def latent_channels(upstream: Any) -> int:
    """The channels of the latents ``upstream.decode`` takes (its family's rule)."""
    return family(upstream).latent_channels(upstream.config)


def video_channels(upstream: Any) -> int:
    """The channels of the video ``upstream.encode`` takes (its family's rule: Wan 2.2's 12 are 3 patchified)."""
    return family(upstream).video_channels(upstream.config)


def loop_switches(family_name: str) -> tuple[str, ...]:
    """The family's own switches of the ``loops`` stage (its frame scan, tile batching): off, upstream's loops run.

    Turned off together they leave upstream's Python loops, unrolled into
    the one jit (`bench.compile_time`'s unrolled mode).
    """
    from cogvideox_torchax.patches.registry import patches_for

    return tuple(p.switch for p in patches_for(family_name) if p.stage == "loops" and p.families is not None)


def unrolled_options(dtype: str, family_name: str):
    """`RuntimeOptions` of upstream's loops traced into the jit: `loop_switches` off."""
    import cogvideox_torchax as ct

    return ct.RuntimeOptions(dtype=dtype, **dict.fromkeys(loop_switches(family_name), False))


def flax_skipped(model: str) -> str | None:
    """Why the Flax port does not run for ``--model`` (None where it does)."""
    found = family_of_model(model)
    if found.name in FLAX_PORT_FAMILIES:
        return None
    return f"not run: the Flax port (bench/flax_vae.py) is CogVideoX's decoder only; {model} is {found.title}"


def shapes(args: argparse.Namespace, channels: int) -> list[tuple[int, ...]]:
    """The ``(B, C, T, H, W)`` latent shapes ``--shape``, ``--batch`` and ``--sweep`` describe."""
    out = []
    for text in args.shape or ["3,8,8"]:
        values = [int(v) for v in text.split(",")]
        if len(values) == 3:
            values = [args.batch, channels, *values]
        elif len(values) != 5:
            raise SystemExit(f"error: --shape takes T,H,W or B,C,T,H,W, got {text!r}")
        if values[1] != channels:
            raise SystemExit(f"error: the model has {channels} latent channels, --shape says {values[1]}")
        out.append(tuple(values))
    if not args.sweep:
        return out
    if len(out) > 1:
        raise SystemExit("error: --sweep takes one --shape to sweep from")
    b, c, t, h, w = out[0]
    sweep = [int(v) for v in (args.sweep_values or SWEEP_DEFAULTS[args.sweep]).split(",")]
    if args.sweep == "frames":
        return [(b, c, v, h, w) for v in sweep]
    return [(b, c, t, v, v) for v in sweep]


def latents(shape: tuple[int, ...], seed: int):
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def options(args: argparse.Namespace):
    """Our `RuntimeOptions` from ``--dtype`` and the ``--option NAME=BOOL`` switches."""
    import cogvideox_torchax as ct

    switches, by_name = {}, {}
    for item in args.option:
        name, _, value = item.partition("=")
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"error: --option {item!r}: expected NAME=true|false")
        # A registered patch without a field of its own is switched by name.
        (switches if name in ct.RuntimeOptions.switches() else by_name)[name] = value.lower() in ("true", "1")
    try:
        return ct.RuntimeOptions(dtype=args.dtype, patches=by_name, **switches)
    except ValueError as e:
        raise SystemExit(f"error: --option: {e}") from None
