"""What upstream refuses, refused alike: upstream's own decode or encode run on the meta device, before ours.

Upstream's checks live in its code and in torch's ops (a kernel larger than
a padded frame, a reflection pad wider than its input, an input dtype its
weights cannot take, a timestep it cannot use), not in a list this package
could keep. So before a new kind of call runs, `check` runs upstream's own
method, built from the same config with no weights (``torch.device("meta")``:
shapes and types only, no arithmetic), on inputs of the caller's shape and
dtype kind with the caller's other arguments. What it raises is raised, as
its own type (and a `ValueError`, which the commands report as bad input;
where torch's meta checks and its CPU kernels differ, the parent type: a
`RuntimeError` for bool latents whose CPU reflection pad raises its subclass
`NotImplementedError`); a call it would answer with an empty tensor is
refused too.

Floating dtypes of any width are taken and cast, as this package always has
(upstream would ask for its weights' dtype); other kinds (complex, integer,
bool) reach upstream's check as they are. The check costs one meta call per
new kind of call (docs/configs.md: up to about 2 s at the real configs'
sizes on a 2-core CPU, before a compile of tens of seconds).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

_META: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


@functools.cache
def _refusal(kind: type[BaseException]) -> type[BaseException]:
    """``kind`` that is also a `ValueError` (the commands' bad input): upstream's type, for whoever catches it."""
    if issubclass(kind, ValueError) or not issubclass(kind, Exception):
        return kind
    try:
        return type(kind.__name__, (kind, ValueError), {"__module__": kind.__module__})
    except TypeError:  # a layout that cannot be combined: a plain ValueError
        return ValueError


def build_meta(family: Any, config: Mapping[str, Any]) -> torch.nn.Module:
    """Upstream's module of ``config`` on the meta device: shapes and types only, no weights."""
    with torch.device("meta"):
        return family.upstream.from_config(dict(config)).eval()


def _meta_module(vae: Any) -> tuple[torch.nn.Module, set]:
    # Under _LOCK (the caller's).
    found = _META.get(vae)
    if found is None:
        found = _META[vae] = (build_meta(vae.family, vae.config), set())
    return found


def _meta_like(x: Any) -> torch.Tensor:
    """A meta tensor of ``x``'s shape: float32 for any floating dtype (cast before running), else its own dtype."""
    dtype = x.dtype if isinstance(x, torch.Tensor) else np.dtype(x.dtype)
    if isinstance(dtype, torch.dtype):
        torch_dtype = torch.float32 if dtype.is_floating_point else dtype
    elif jnp.issubdtype(dtype, jnp.floating):
        torch_dtype = torch.float32
    else:
        torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(tuple(x.shape), dtype=torch_dtype, device="meta")


def _meta_value(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def _signature(x: Any, inputs: Mapping[str, Any]) -> tuple:
    def of(v: Any) -> Any:
        if isinstance(v, torch.Tensor | np.ndarray) or hasattr(v, "shape") and hasattr(v, "dtype"):
            return ("array", tuple(v.shape), str(v.dtype))
        return (type(v).__name__, v) if isinstance(v, int | float | bool | str | bytes | type(None)) else type(v)

    return (tuple(x.shape), str(x.dtype), tuple(sorted((k, of(v)) for k, v in inputs.items())))


def check(vae: Any, kind: str, x: Any, inputs: Mapping[str, Any] | None = None) -> None:
    """Raises what upstream's ``kind`` (``"decode"``, ``"encode"``) raises for ``x`` and ``inputs``, once per call kind.

    Args:
        vae: the `TorchaxVAE` (its family, config and upstream attributes, such as tiling, are upstream's).
        x: the latents or the video, any array with a shape and a dtype.
        inputs: upstream's other arguments of a decode, by name, as the caller gave them; one left out
            (None) stands for what this package passes then (`Family.decode_input_values`: LTX-2's
            ``temb`` 0, as its pipelines pass it), where upstream would have nothing.

    Raises:
        upstream's own error type, also a `ValueError`: the message says
        which call upstream refuses and why, in upstream's words. `ValueError`:
        a call upstream answers with an empty tensor.
    """
    inputs = dict(inputs or {})
    # Tiling and framewise switches, tile sizes: upstream's plain attributes, as the user set them.
    settings = {k: v for k, v in vars(vae.module).items()
                if not k.startswith("_") and k != "training" and isinstance(v, bool | int | float)}
    key = (kind, _signature(x, inputs), tuple(sorted(settings.items())))
    with _LOCK:  # one meta module per VAE, its attributes set for this call: one call at a time
        module, checked = _meta_module(vae)
        if key not in checked:
            _run(vae, module, kind, x, inputs, settings)
            checked.add(key)


def meta_call(family: Any, config: Mapping[str, Any], module: torch.nn.Module, kind: str, x: Any,
              inputs: Mapping[str, Any], settings: Mapping[str, Any]) -> Any:
    """Upstream's ``kind`` of the meta ``module`` (`build_meta`) on a meta ``x``, its attributes set to ``settings``.

    The caller holds ``module`` alone meanwhile. ``inputs``: upstream's other
    arguments of a decode (None for one the caller left out: what this
    package passes then, `Family.decode_input_values`).
    """
    for name, value in settings.items():
        setattr(module, name, value)
    defaults = {}
    if kind == "decode":
        names = family.decode_inputs(config)
        defaults = dict(zip(names, family.decode_input_values(config, x.shape[0], {}), strict=True))
    args = {k: _meta_value(torch.tensor(defaults[k]) if v is None and k in defaults else v)
            for k, v in inputs.items()}
    args.update({k: _meta_value(torch.tensor(v)) for k, v in defaults.items() if k not in inputs})
    with torch.no_grad():
        return getattr(module, kind)(_meta_like(x), **args)


def _run(vae: Any, module: torch.nn.Module, kind: str, x: Any, inputs: dict[str, Any],
         settings: Mapping[str, Any]) -> None:
    what = "latents" if kind == "decode" else "video"
    shown = f"{what} of shape {tuple(x.shape)} ({x.dtype})"
    try:
        out = meta_call(vae.family, vae.config, module, kind, x, inputs, settings)
    except Exception as e:  # upstream's refusal, whatever it is: raised as its own type
        first = " ".join(str(e).split())
        raise _refusal(type(e))(f"{vae.family.class_name}.{kind} refuses {shown}, as upstream does: {first}") from e
    result = out.sample if kind == "decode" else out.latent_dist.mean
    if 0 in result.shape:
        raise ValueError(f"{vae.family.class_name}.{kind} of {shown} would give an empty tensor "
                         f"{tuple(result.shape)}; refused (upstream returns it empty)")
