import pathlib
import re

import torch

from cogvideox_torchax import _torch_compat


def test_torchax_imports_and_every_overload_it_names_resolves():
    torchax = _torch_compat.import_torchax()
    assert torchax.__version__
    names = set()
    for path in pathlib.Path(torchax.__file__).parent.rglob("*.py"):
        names.update(re.findall(r"torch\.ops\.aten\.(\w+)\.(\w+)", path.read_text()))
    assert len(names) > 100  # the scan really read torchax's op tables
    unresolved = []
    for packet, overload in sorted(names):
        try:
            getattr(getattr(torch.ops.aten, packet), overload)
        except AttributeError:
            unresolved.append(f"{packet}.{overload}")
    assert not unresolved, f"torchax names overloads this torch lacks and the shim does not cover: {unresolved}"


def test_placeholders_only_for_missing_overloads():
    before = torch.ops.aten.add.Tensor
    assert _torch_compat.install_missing_overload_placeholders((("add", "Tensor"),)) == []
    assert torch.ops.aten.add.Tensor is before
    assert isinstance(before, torch._ops.OpOverload)


def test_placeholder_is_idempotent_and_inert():
    pair = (("add", "Tensor_Dimname_test_only"),)
    try:
        assert _torch_compat.install_missing_overload_placeholders(pair) == ["aten::add.Tensor_Dimname_test_only"]
        placeholder = torch.ops.aten.add.Tensor_Dimname_test_only
        assert isinstance(placeholder, _torch_compat.RemovedOverload)
        _torch_compat.install_missing_overload_placeholders(pair)
        assert torch.ops.aten.add.Tensor_Dimname_test_only is placeholder
        # torch's decomposition lookup skips it rather than failing.
        assert torch._decomp.get_decompositions([placeholder]) == {}
    finally:
        del torch.ops.aten.add.Tensor_Dimname_test_only


def test_current_torch_needs_exactly_the_listed_overloads():
    # On torch 2.13 all of them are missing; on a torch that still has the
    # named-tensor overloads (e.g. 2.11) none are, and nothing is touched.
    missing = [
        (p, o) for p, o in _torch_compat.TORCHAX_DIMNAME_OVERLOADS if o not in getattr(torch.ops.aten, p).overloads()
    ]
    installed = _torch_compat.install_missing_overload_placeholders()
    assert installed == [f"aten::{p}.{o}" for p, o in missing]
