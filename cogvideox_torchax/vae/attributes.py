"""Which attributes of an upstream VAE a `TorchaxVAE` reads through, takes writes of, or refuses.

The rule is general, so an attribute a later diffusers adds follows it:

- Reads: a public attribute of upstream's module whose value, when read, is
  plain data (None, bools, numbers, strings, and tuples and lists of them,
  judged recursively) reads as upstream's (a copy): Wan's
  ``temperal_downsample`` and ``z_dim``, the tile sizes,
  ``is_gradient_checkpointing``. Anything else of upstream's (parameters,
  buffers, submodules, tensors, methods, hooks) raises
  `UnsupportedAttributeError`, so ``hasattr`` says no, except the buffers a
  family's pipelines read (`Family.pipeline_buffers`: LTX-2's latent
  statistics), answered with host copies.
- Writes: upstream's settings (`program.is_setting`: tiling, slicing, frames
  per batch) change the wrapped VAE's decode and encode as they change
  upstream's, and its compiled programs are dropped. Upstream's other public
  attributes are fixed when the VAE is built: writing one is refused, naming
  what sets it. A name upstream's module does not have is the VAE's own, as
  on any module.
- Upstream's deprecated direct config access (``vae.latent_channels``) works
  as on upstream's module, with diffusers' ``FutureWarning``.

The VAE using these provides ``programs`` (its `ProgramCache`: the patched
module of its own program, and ``_pristine``, upstream's unpatched twin),
``family`` and ``reset_programs``.
"""

from __future__ import annotations

import copy
import functools
import numbers
from typing import Any

from diffusers.utils import deprecate

from cogvideox_torchax.vae.program import is_setting, tiling_switches
from cogvideox_torchax.vae.program_cache import to_host_torch

# What `TorchaxVAE` offers of upstream's surface beyond plain data; other
# upstream attributes raise `UnsupportedAttributeError` naming this list.
INFERENCE_SURFACE = (
    "decode",
    "encode",
    "forward",
    "enable_tiling",
    "disable_tiling",
    "enable_slicing",
    "disable_slicing",
    "use_tiling",
    "use_slicing",
    "config",
    "dtype",
    "device",
    "to",
    "eval",
    "train",
    "training",
    "requires_grad_",
    "save_pretrained",
    "from_pretrained",
    "half",
    "float",
    "bfloat16",
    "double",
    "type",
    "cpu",
    "cuda",
)

# torch.nn.Module and ModelMixin attributes that diffusers' pipelines and
# accelerate's offload hooks use on any component, and that are true of this
# VAE as they stand: it has no torch submodules (`modules` yields itself,
# `children` nothing) and its config file name is upstream's.
_MODULE_ATTRIBUTES_KEPT = (
    "modules",
    "named_modules",
    "children",
    "named_children",
    "config_name",
    "extra_repr",
    "dump_patches",
    "call_super_init",
)


class UnsupportedAttributeError(AttributeError, NotImplementedError):
    """An attribute of an upstream VAE (of any family's class) that `TorchaxVAE` does not offer.

    Both an AttributeError (so ``hasattr`` and ``getattr(obj, name, default)``
    answer "absent", as diffusers' pipelines probe components) and a
    NotImplementedError (it exists upstream, just not here).
    """


def is_plain(value: Any) -> bool:
    """Whether ``value`` is plain data: None, a bool, number or string, or a tuple or list of plain data."""
    if value is None or isinstance(value, (numbers.Number, str)):
        return True
    if isinstance(value, (tuple, list)):
        return all(is_plain(v) for v in value)
    return False


def read(vae: Any, name: str) -> Any:
    """``vae.name`` where ordinary lookup found nothing of the VAE's own: upstream's plain data, else an error.

    Raises:
        UnsupportedAttributeError: an attribute of upstream's that is not plain data.
        AttributeError: a name upstream's module does not have either.
    """
    programs = vae.__dict__.get("programs")
    if programs is None or name.startswith("__"):
        raise AttributeError(f"{type(vae).__name__!r} object has no attribute {name!r}", name=name, obj=vae)
    module = programs.own.module
    if name in module.config and name not in vars(module):
        # Upstream's deprecated direct config access, with its warning.
        deprecate(
            "direct config name access",
            "1.0.0",
            f"Accessing config attribute `{name}` directly via '{type(vae).__name__}' object attribute is "
            f"deprecated. Please access '{name}' over '{type(vae).__name__}'s config object instead, e.g. "
            f"'vae.config.{name}'.",
            standard_warn=False,
            stacklevel=4,
        )
        return module.config[name]
    if name in vae.family.pipeline_buffers:
        # A statistic its pipelines read (LTX-2's latents_mean): a host copy, as the module's buffer.
        return to_host_torch(vae.weights[name])
    upstream = programs._pristine  # what upstream's module has, before the patches added theirs
    if not name.startswith("_") and hasattr(upstream, name):
        # The patched module's value: it carries the settings written since.
        value = getattr(module, name, None)
        if is_plain(value):
            return copy.deepcopy(value)  # a list read and changed leaves the VAE as it is, as a setting must be written
    if hasattr(upstream, name) or hasattr(module, name):
        raise UnsupportedAttributeError(
            f"TorchaxVAE does not offer {vae.family.class_name}.{name}: it runs only the inference surface "
            f"({', '.join(INFERENCE_SURFACE)}) under JAX, and reads upstream's other attributes only when they "
            "are plain data; use the upstream module for anything else",
            name=name,
            obj=vae,
        )
    raise AttributeError(f"{type(vae).__name__!r} object has no attribute {name!r}", name=name, obj=vae)


def write(vae: Any, name: str, value: Any) -> bool:
    """Takes ``vae.name = value`` where ``name`` is upstream's (True); False leaves it to ``torch.nn.Module``.

    A setting (`program.is_setting`) upstream's module holds is written to
    the VAE's patched module and its compiled programs are dropped, as
    `enable_tiling` does (slicing is read per call and drops nothing).

    Raises:
        UnsupportedAttributeError: another public attribute of upstream's (fixed when the VAE is built).
        TypeError: a setting given something other than plain data.
    """
    programs = vae.__dict__.get("programs")
    if programs is None or name.startswith("_"):
        return False
    if is_setting(name):
        with programs.lock:  # the one lock of every cache of this VAE; `to(dtype)` swaps `programs` under it
            module = vae.programs.own.module
            if name in vars(module):
                if not is_plain(value):
                    raise TypeError(f"TorchaxVAE.{name} takes plain data, as upstream's, not {type(value).__name__}")
                old = vars(module)[name]
                if type(old) is not type(value) or old != value:
                    setattr(module, name, value)
                    if name != "use_slicing":  # read per call, not while tracing
                        vae.reset_programs()
                return True
    if _own_name(type(vae), name) or name not in dir(programs._pristine):
        return False
    settings = ", ".join(sorted(tiling_switches(programs.own.module)))
    raise UnsupportedAttributeError(
        f"TorchaxVAE does not take writes of {vae.family.class_name}.{name}: it is fixed when the VAE is built "
        f"(upstream's config and structure); build the upstream module with the value you want "
        f"({vae.family.class_name}.from_config or from_pretrained) and wrap that. The settings upstream's decode "
        f"and encode read can be written, or set by enable_tiling / enable_slicing: {settings}",
        name=name,
        obj=vae,
    )


def _own_name(cls: type, name: str) -> bool:
    # Whether the definition ``name`` finds on ``cls`` is the VAE's own (not torch's, diffusers' or a refused one).
    for base in cls.__mro__:
        if name in vars(base):
            upstreams = base.__module__.startswith(("torch.", "diffusers."))
            return not upstreams and not isinstance(vars(base)[name], _Refused)
    return False


class _Refused(property):
    """A torch or diffusers module attribute outside the surface: its plain value read as upstream's, else refused."""

    def __init__(self, name: str) -> None:
        super().__init__(functools.partial(read, name=name))


def refuse_other_module_attributes(cls: type) -> type:
    """Makes the public ``torch.nn.Module`` / ``ModelMixin`` attributes of ``cls`` outside the surface upstream's.

    ``state_dict``, ``parameters``, hooks, gradient checkpointing and the
    rest would act on torch parameters and submodules the VAE does not
    have (its weights are JAX arrays), silently. Each becomes a property
    that reads as `read` does: upstream's value when it is plain data
    (``is_gradient_checkpointing``, ``has_compatibles``), else
    `UnsupportedAttributeError`, so ``hasattr`` says no.
    """
    names = {name for base in cls.__mro__ for name in vars(base) if not name.startswith("_")}
    for name in sorted(names - set(INFERENCE_SURFACE) - set(_MODULE_ATTRIBUTES_KEPT)):
        # Only where torch's or diffusers' definition is the one found (ours win).
        owner = next(base for base in cls.__mro__ if name in vars(base))
        if owner.__module__.startswith(("torch.", "diffusers.")):
            setattr(cls, name, _Refused(name))
    return cls
