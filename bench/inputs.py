"""What every system of `bench.decode` is given: the model, the latent shapes, the options."""

from __future__ import annotations

import argparse

SYSTEMS = ("torchax", "flax", "torch")
SWEEP_DEFAULTS = {"frames": "1,3,5,9", "resolution": "8,16,24,32"}


def load_upstream(model: str, seed: int):
    """``random:PRESET`` (any name in `cogvideox_torchax.config.PRESETS`) or a local diffusers folder."""
    from diffusers import AutoencoderKLCogVideoX

    import cogvideox_torchax as ct

    if model.startswith("random:"):
        return ct.random_upstream(model[len("random:") :], seed=seed)
    return AutoencoderKLCogVideoX.from_pretrained(model).eval()


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
