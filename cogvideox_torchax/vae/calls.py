"""One decode or encode of a `TorchaxVAE`: its planner held throughout, batch elements sliced and joined, inputs placed.

A call reads the VAE's planner once (`planner_of`): every batch element of
a sliced call, and its retry after running out of memory, run in the dtype
the call started with, whatever ``to(dtype)`` does meanwhile in another
thread. With slicing on (upstream's ``enable_slicing``) a batch runs one
element at a time, through one executable for batch 1, and the results are
joined on device.
"""

from __future__ import annotations

import contextvars
from typing import Any

import jax
import numpy as np
import torch

from cogvideox_torchax.memory.planner import Planner
from cogvideox_torchax.memory.retry import retry_out_of_memory
from cogvideox_torchax.parallel import sharding
from cogvideox_torchax.vae.program_cache import to_numpy

# The VAE and planner a running decode or encode started with (per thread).
_CALL: contextvars.ContextVar[tuple[Any, Planner] | None] = contextvars.ContextVar("torchax_vae_call", default=None)


def check_5d(shape: tuple[int, ...], what: str, layout: str, channels: int) -> None:
    """Raises ValueError unless ``shape`` is 5-D with ``channels`` in dim 1 and no empty dimension."""
    if len(shape) != 5:
        raise ValueError(f"{what} must be {layout}, got shape {tuple(shape)}")
    if shape[1] != channels:
        raise ValueError(f"{what} must have {channels} channels (dim 1), got shape {tuple(shape)}")
    if min(shape) < 1:
        raise ValueError(f"{what} shape {tuple(shape)} has an empty dimension")


def planner_of(vae: Any) -> Planner:
    """The planner of the call this thread is running on ``vae``, else ``vae``'s current one."""
    call = _CALL.get()
    return call[1] if call is not None and call[0] is vae else vae.planner


def prepare(vae: Any, kind: str, x: torch.Tensor | np.ndarray | jax.Array) -> tuple[jax.stages.Compiled, tuple]:
    """The planned executable of ``kind`` for ``x`` and its arguments (the weights, ``x`` on the plan's mesh)."""
    shape = tuple(x.shape)
    (vae.check_video if kind == "encode" else vae.check_latents)(shape)
    planner = planner_of(vae)  # one VAE state throughout
    executable, weights, mesh = planner.executable(kind, shape)
    arr = to_numpy(x, np.dtype(planner.programs.options.jax_dtype))
    return executable, (weights, sharding.place(arr, sharding.input_sharding(arr.shape, mesh)))


def _execute(vae: Any, kind: str, x: torch.Tensor | np.ndarray | jax.Array) -> Any:
    def run() -> Any:
        executable, args = prepare(vae, kind, x)
        return executable(*args)

    return retry_out_of_memory(planner_of(vae), kind, tuple(x.shape), run)


def run(vae: Any, kind: str, x: torch.Tensor | np.ndarray | jax.Array) -> Any:
    """Runs ``kind`` (``"decode"``, ``"frames"``, ``"encode"``) on ``x``, a batch element at a time with slicing on.

    Each element is placed anew, as a compiled program takes only the
    argument sharding it was compiled for.
    """
    token = _CALL.set((vae, vae.planner))
    try:
        if not vae.use_slicing or x.shape[0] == 1:
            return _execute(vae, kind, x)
        parts = [_execute(vae, kind, x[i : i + 1]) for i in range(x.shape[0])]
    finally:
        _CALL.reset(token)
    if kind == "frames":
        return tuple(jax.numpy.concatenate(p, axis=0) for p in zip(*parts, strict=True))
    return jax.numpy.concatenate(parts, axis=0)
