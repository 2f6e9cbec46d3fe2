"""Keeps torchax from registering "jax" as torch's accelerator, so torch stays whole beside our programs.

On import, torchax 0.0.13 renames torch's PrivateUse1 backend to ``"jax"``
and registers a device module for it. torch then takes that backend for the
process's accelerator (``torch.accelerator.current_accelerator()`` is
``jax``, ahead of CUDA), although no such device is linked into torch: every
``torch.compile`` (dynamo asks the accelerator for its current stream), and
inductor's cache keys, fail with "PyTorch is not linked with support for jax
devices" for the rest of the process (pytorch/xla issue 9730). A rename
cannot be undone, so it must never happen: torchax is imported with the two
registration calls skipped for ``"jax"``, and its tensors report the
unrenamed backend's device, ``privateuseone:0``, which torchax already
treats as its own (tensor constructors given that device, ``to`` it). Inside
torchax's environment ``to("jax")`` still moves a tensor or module to JAX:
its function mode answers before torch parses the string.

If torchax was imported before this package, the rename has happened and
cannot be taken back: `registered_by_someone_else` says so, and the package
warns once (docs/pipelines.md gives the workaround: import
``cogvideox_torchax`` first).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
import warnings
from collections.abc import Iterator

# torchax's name for torch's PrivateUse1 backend, and the unrenamed one.
TORCHAX_NAME = "jax"
UNRENAMED = "privateuseone"


class TorchaxRegisteredWarning(UserWarning):
    """torchax was imported before this package and registered "jax" as torch's accelerator."""


def backend_name() -> str:
    """The name torch gives its PrivateUse1 backend now (``"privateuseone"`` unless someone renamed it)."""
    import torch

    return torch._C._get_privateuse1_backend_name()


def registered_by_someone_else() -> bool:
    """Whether torch's PrivateUse1 backend is named ``"jax"``, i.e. torchax was imported without this package."""
    return backend_name() == TORCHAX_NAME


@contextlib.contextmanager
def _registration_skipped() -> Iterator[None]:
    # torch.utils.rename_privateuse1_backend and torch._register_device_module,
    # as torchax calls them at import: skipped for its name only.
    import torch
    import torch.utils

    rename, register = torch.utils.rename_privateuse1_backend, torch._register_device_module

    def skip_rename(name: str) -> None:
        if name != TORCHAX_NAME:
            rename(name)

    def skip_register(name: str, module: types.ModuleType) -> None:
        if name != TORCHAX_NAME:
            register(name, module)

    torch.utils.rename_privateuse1_backend, torch._register_device_module = skip_rename, skip_register
    try:
        yield
    finally:
        torch.utils.rename_privateuse1_backend, torch._register_device_module = rename, register


def _report_unrenamed_device(torchax: types.ModuleType) -> None:
    # torchax's tensors and views say ``jax:0``, which only parses once the
    # backend is renamed; the unrenamed name is the same device to torchax.
    # torch's reference decompositions (``new_zeros`` and the like) look up
    # the device's module by that name: torchax's, as it registers it for
    # "jax". Registering a module renames nothing, so torch's accelerator
    # stays as it is.
    import torch

    device = torch.device(UNRENAMED, 0)
    for cls in (torchax.tensor.Tensor, torchax.view.View):
        cls.device = property(lambda self: device, doc="The device torchax tensors live on (PrivateUse1).")
    if not hasattr(torch, UNRENAMED):
        torch._register_device_module(UNRENAMED, torchax.device_module)


def import_confined() -> types.ModuleType:
    """Imports torchax without its accelerator registration (or returns it, warning if it registered already).

    Returns:
        The `torchax` module.
    """
    if "torchax" in sys.modules:
        torchax = sys.modules["torchax"]
        if registered_by_someone_else() and not getattr(torchax, "_cogvideox_torchax_warned", False):
            torchax._cogvideox_torchax_warned = True
            warnings.warn(
                "torchax was imported before cogvideox_torchax and registered 'jax' as torch's accelerator, "
                "which makes torch.compile fail in this process (pytorch/xla#9730); import cogvideox_torchax "
                "before torchax (docs/pipelines.md)",
                TorchaxRegisteredWarning,
                stacklevel=3,
            )
        return torchax
    with _registration_skipped():
        torchax = importlib.import_module("torchax")
    _report_unrenamed_device(torchax)
    return torchax
