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
import inspect
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import torch

from cogvideox_torchax.memory.planner import Planner
from cogvideox_torchax.memory.retry import retry_out_of_memory
from cogvideox_torchax.parallel import sharding
from cogvideox_torchax.vae import drawn_noise
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


def bind(vae: Any, method: str, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments bound to the family's upstream ``method`` (defaults filled), checked by the family.

    Raises:
        TypeError: arguments upstream's ``method`` does not take.
        ValueError: values the wrapped VAE cannot honour (`Family.check_call`).
    """
    signature = inspect.signature(getattr(vae.family.upstream, method))
    bound = signature.bind(None, *args, **kwargs)  # None stands for upstream's self
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(signature.parameters)))
    vae.family.check_call(vae.config, method, arguments)
    return arguments


def decode_inputs(vae: Any, batch: int, given: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    """The family's decode inputs for ``batch`` videos from keyword arguments named as upstream's decode names them.

    Raises:
        TypeError: a name upstream's decode does not take besides the latents.
    """
    names = set(inspect.signature(vae.family.upstream.decode).parameters) - {"self", "z", "return_dict"}
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(f"{vae.family.class_name}.decode takes no argument {unknown[0]!r}"
                        + (f" (it takes {', '.join(sorted(names))})" if names else ""))
    vae.family.check_call(vae.config, "decode", given)
    return vae.family.decode_input_values(vae.config, batch, given)


def planner_of(vae: Any) -> Planner:
    """The planner of the call this thread is running on ``vae``, else ``vae``'s current one."""
    call = _CALL.get()
    return call[1] if call is not None and call[0] is vae else vae.planner


def prepare(vae: Any, kind: str, x: torch.Tensor | np.ndarray | jax.Array,
            inputs: tuple[np.ndarray, ...] = ()) -> tuple[jax.stages.Compiled, tuple]:
    """The planned executable of ``kind`` for ``x`` and its arguments: the weights, ``x`` and ``inputs``, placed.

    ``inputs``: the family's decode inputs (`Family.decode_input_values`), each ``(B,)``; none for an encode.
    A decode whose upstream draws noise (`drawn_noise`) draws it here, from
    torch's generator, and the arguments end with the draws.
    """
    shape = tuple(x.shape)
    (vae.check_video if kind == "encode" else vae.check_latents)(shape)
    planner = planner_of(vae)  # one VAE state throughout
    executable, weights, mesh = planner.executable(kind, shape)
    options = planner.programs.options
    dtype = np.dtype(options.jax_dtype)
    arrays = [to_numpy(a, dtype) for a in (x, *inputs)]
    placed = [sharding.place(a, sharding.input_sharding(a.shape, mesh)) for a in arrays]
    if kind != "encode" and vae.family.draws_noise(vae.config):
        # Drawn now, as upstream's decode would draw them, in the shapes this executable takes after the inputs.
        wanted = [a.shape for a in executable.args_info[0][2 + len(inputs):]]
        device = x.device if isinstance(x, torch.Tensor) else "cpu"
        placed += [sharding.place(to_numpy(a, dtype), sharding.replicated(mesh))
                   for a in drawn_noise.draw(wanted, options.torch_dtype, device)]
    return executable, (weights, *placed)


def _execute(vae: Any, kind: str, x: torch.Tensor | np.ndarray | jax.Array, inputs: tuple[np.ndarray, ...]) -> Any:
    def run() -> Any:
        executable, args = vae.prepare(kind, x, inputs)  # the VAE's method: what a caller wraps, runs
        return executable(*args)

    return retry_out_of_memory(planner_of(vae), kind, tuple(x.shape), run)


def run(vae: Any, kind: str, x: torch.Tensor | np.ndarray | jax.Array, inputs: tuple[np.ndarray, ...] = ()) -> Any:
    """Runs ``kind`` (``"decode"``, ``"frames"``, ``"encode"``) on ``x``, a batch element at a time with slicing on.

    Each element is placed anew, as a compiled program takes only the
    argument sharding it was compiled for.
    """
    token = _CALL.set((vae, vae.planner))
    try:
        if not vae.use_slicing or x.shape[0] == 1:
            return _execute(vae, kind, x, inputs)
        parts = [_execute(vae, kind, x[i : i + 1], tuple(v[i : i + 1] for v in inputs)) for i in range(x.shape[0])]
    finally:
        _CALL.reset(token)
    if kind == "frames":
        return tuple(jax.numpy.concatenate(p, axis=0) for p in zip(*parts, strict=True))
    return jax.numpy.concatenate(parts, axis=0)
