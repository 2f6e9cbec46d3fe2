"""Noise that upstream's decode draws from torch's global generator, drawn as upstream draws it and fed to our programs.

LTX decoders with ``decoder_inject_noise`` (LTX-Video 0.9.1) add, in each
noise-injecting resnet, ``torch.randn`` of the feature map's height and
width from torch's global generator, on every call. A compiled program
cannot draw from torch's generator, so each call draws on the host, in
upstream's order, with upstream's shapes and the run's dtype, just before
it runs, and the program takes the draws as inputs after the decode inputs:
while it is traced, each ``torch.randn`` in upstream's code takes the next
one (`supplying`). The shapes come from upstream's own decode on the meta
device with the program's settings (`shapes`), so the order is upstream's
by construction, tiles and all. From the same generator state, the wrapped
VAE's decode gives upstream's video, and leaves the generator where
upstream's decode would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from cogvideox_torchax.parallel import distributed
from cogvideox_torchax.vae import as_upstream


class _Recorder(TorchFunctionMode):
    # Each torch.randn's shape, in call order; everything else runs as it would.
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.randn:
            self.shapes.append(tuple(out.shape))
        return out


class _Supplier(TorchFunctionMode):
    # Each torch.randn answered by the next of the given tensors, checked against the shape asked for.
    def __init__(self, draws: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.draws = list(draws)
        self.used = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.randn:
            return func(*args, **kwargs)
        probe = torch.empty(*args, device="meta") if args else torch.empty(kwargs["size"], device="meta")
        if self.used >= len(self.draws) or tuple(self.draws[self.used].shape) != tuple(probe.shape):
            have = tuple(self.draws[self.used].shape) if self.used < len(self.draws) else "none left"
            raise RuntimeError(f"upstream drew noise of shape {tuple(probe.shape)} as draw {self.used + 1}, "
                               f"where the program was given {have}: its draws were recorded for another decode")
        draw = self.draws[self.used]
        self.used += 1
        dtype = kwargs.get("dtype")
        return draw if dtype is None else draw.to(dtype)


# Per config (its JSON): the meta module the draws are recorded on, and the shapes recorded, by call.
_RECORDED: dict[str, tuple[torch.nn.Module, dict]] = {}
_LOCK = threading.Lock()


def shapes(family: Any, config: Mapping[str, Any], shape: tuple[int, ...],
           settings: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    """The shapes upstream's decode of latents ``shape`` draws, in order, with ``settings`` set (none for most).

    ``settings``: upstream's tiling and slicing attributes as the program
    holds them (`program.tiling_switches`). Recorded once per call.
    """
    if not family.draws_noise(config):
        return ()
    name = json.dumps({k: v for k, v in dict(config).items() if not k.startswith("_")}, sort_keys=True, default=str)
    call = (tuple(shape), tuple(sorted(settings.items())))
    with _LOCK:  # one meta module per config, its attributes set for this call
        if name not in _RECORDED:
            _RECORDED[name] = (as_upstream.build_meta(family, config), {})
        module, recorded = _RECORDED[name]
        if call not in recorded:
            recorder = _Recorder()
            with recorder:
                as_upstream.meta_call(family, config, module, "decode",
                                      torch.empty(shape, device="meta"), {}, settings)
            recorded[call] = tuple(recorder.shapes)
        return recorded[call]


# Set by the commands (`seeded_calls`): every call draws from a generator of its own seeded so.
_SEED: int | None = None


@contextmanager
def seeded_calls(seed: int | None) -> Iterator[None]:
    """Within it (process-wide), each decode draws its noise from a fresh generator seeded ``seed``.

    The commands run within ``seeded_calls(0)``: the same latents give the
    same video on every run and in any batch (upstream's draws are one per
    feature map, shared by the batch), the video upstream gives after
    ``torch.manual_seed(0)``. Outside it, torch's global generator, as
    upstream (the library's default).
    """
    global _SEED
    before, _SEED = _SEED, seed
    try:
        yield
    finally:
        _SEED = before


def draw(draw_shapes: Sequence[tuple[int, ...]], dtype: torch.dtype, device: Any = "cpu") -> tuple[np.ndarray, ...]:
    """Draws of ``draw_shapes`` from torch's global generator for ``device``, as upstream's decode draws them.

    Or from a generator seeded as `seeded_calls` says. Returned as float32
    host arrays (exact for any float dtype of 32 bits or fewer). Under
    jax.distributed, process 0's draws on every process (one broadcast), so
    that the program's replicated inputs are the same everywhere whatever
    each process's generator holds; every process must call it.
    """
    if not draw_shapes:
        return ()
    device = torch.device(device)
    generator = None
    if _SEED is not None or device.type == "meta":
        device = torch.device("cpu")
    if _SEED is not None:
        generator = torch.Generator(device).manual_seed(_SEED)
    drawn = [torch.randn(s, generator=generator, device=device, dtype=dtype).float().cpu().numpy()
             for s in draw_shapes]
    if distributed.process_count() == 1:
        return tuple(drawn)
    flat = distributed.share_array(np.concatenate([a.reshape(-1) for a in drawn]))
    ends = np.cumsum([a.size for a in drawn])
    return tuple(part.reshape(a.shape) for part, a in zip(np.split(flat, ends[:-1]), drawn, strict=True))


@contextmanager
def supplying(draws: Sequence[torch.Tensor]) -> Iterator[None]:
    """Within it, each ``torch.randn`` takes the next of ``draws`` (traced inputs); all must be taken.

    Raises:
        RuntimeError: a draw of another shape than the next one, or draws left over.
    """
    supplier = _Supplier(draws)
    with supplier:
        yield
    if supplier.used != len(supplier.draws):
        raise RuntimeError(f"upstream drew {supplier.used} noise tensors where the program was given "
                           f"{len(supplier.draws)}: its draws were recorded for another decode")
