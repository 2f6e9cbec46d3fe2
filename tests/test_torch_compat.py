"""torchax imports on the installed torch: placeholders for exactly the ops it names that torch lacks."""

import importlib
import pathlib
import re

import pytest
import torch

from cogvideox_torchax import _torch_compat


def _torch_defines(namespace: str, op: str, overload: str | None) -> bool:
    # Asks the dispatcher's schema table, which no placeholder can fool.
    schemas = torch._C._jit_get_schemas_for_operator(f"{namespace}::{op}")
    return bool(schemas) and (overload is None or any(s.overload_name == overload for s in schemas)
                              or (overload == "default" and any(s.overload_name == "" for s in schemas)))


def test_torchax_imports_and_every_op_it_names_resolves():
    torchax = _torch_compat.import_torchax()
    importlib.import_module("torchax.ops.jaten")  # the registry's decorators name most ops

    assert torchax.__version__
    names = _torch_compat.torchax_op_names()
    assert len(names) > 1000  # the scan really read torchax's op tables
    unresolved = []
    for namespace, op, overload in sorted(names, key=str):
        if namespace not in _torch_compat.CORE_NAMESPACES:
            continue
        try:
            packet = getattr(getattr(torch.ops, namespace), op)
            if overload is not None and not hasattr(torch._ops.OpOverloadPacket, overload):
                getattr(packet, overload)
        except AttributeError:
            unresolved.append(f"{namespace}::{op}.{overload}")
    assert not unresolved, f"torchax names ops this torch lacks and no placeholder covers: {unresolved}"


def test_the_syntax_scan_finds_everything_a_plain_text_scan_does():
    # A second, independent reading of torchax's files: every dotted name
    # torch.ops.aten.<op>.<overload> in the text is among the scanned names.
    root = pathlib.Path(_torch_compat.importlib.util.find_spec("torchax").origin).parent
    text = set()
    for path in root.rglob("*.py"):
        text.update(re.findall(r"torch\.ops\.aten\.(\w+)\.(\w+)", path.read_text()))
    scanned = {(op, ov) for ns, op, ov in _torch_compat.torchax_op_names() if ns == "aten"}
    assert len(text) > 100 and text <= scanned


def test_a_placeholder_only_where_torch_lacks_the_op():
    installed = _torch_compat.install_placeholders()
    for name in installed:
        namespace, rest = name.split("::")
        op, _, overload = rest.partition(".")
        assert not _torch_defines(namespace, op, overload or None), f"{name} exists, yet has a placeholder"
    # Where torch has the op, nothing is installed and the real op stays.
    before = torch.ops.aten.add.Tensor
    assert _torch_compat.install_placeholders({("aten", "add", "Tensor"), ("aten", "add", None)}) == []
    assert torch.ops.aten.add.Tensor is before and isinstance(before, torch._ops.OpOverload)


def test_the_scan_reads_aliases_and_skips_packet_methods():
    source = (
        "import torch\nfrom torch.ops import aten as A\nprims = torch._ops.ops.prims\n"
        "x = {A.foo.bar: 1, prims.baz: 2, torch.ops.aten.qux.default: 3, torch.ops.aten.add.overloads(): 4}\n"
        "torch.ops.torchvision.nms\n"
    )
    assert _torch_compat._names_in_source(source) == {
        ("aten", "foo", "bar"), ("prims", "baz", None), ("aten", "qux", "default"), ("aten", "add", "overloads"),
        ("torchvision", "nms", None),
        # each packet is named by itself too (the inner part of each chain)
        ("aten", "foo", None), ("aten", "qux", None), ("aten", "add", None),
    }
    assert _torch_compat.install_placeholders({("aten", "add", "overloads")}) == []
    # Other namespaces are filled by later imports: never touched.
    assert _torch_compat.install_placeholders({("torchvision", "nms_test_only", None)}) == []
    assert "nms_test_only" not in torch.ops.torchvision.__dict__


def test_a_missing_overload_placeholder_is_idempotent_and_inert():
    names = {("aten", "add", "Tensor_Dimname_test_only")}
    try:
        assert _torch_compat.install_placeholders(names) == ["aten::add.Tensor_Dimname_test_only"]
        placeholder = torch.ops.aten.add.Tensor_Dimname_test_only
        assert isinstance(placeholder, _torch_compat.RemovedOverload)
        _torch_compat.install_placeholders(names)
        assert torch.ops.aten.add.Tensor_Dimname_test_only is placeholder
        assert torch._decomp.get_decompositions([placeholder]) == {}
        assert {placeholder: 1}.get(torch.ops.aten.add.Tensor) is None
        with pytest.raises(_torch_compat.RemovedOpError, match=r"aten::add\.Tensor_Dimname_test_only"):
            placeholder(torch.ones(1))
    finally:
        del torch.ops.aten.add.Tensor_Dimname_test_only


def test_a_missing_op_gets_a_packet_whose_overloads_are_placeholders():
    names = {("aten", "removed_op_test_only", None), ("aten", "removed_op_test_only", "out")}
    try:
        assert _torch_compat.install_placeholders(names) == ["aten::removed_op_test_only"]
        packet = torch.ops.aten.removed_op_test_only
        assert isinstance(packet, _torch_compat.RemovedPacket)
        assert packet.default is packet.default and packet.default is not packet.out
        assert _torch_compat.install_placeholders(names) == ["aten::removed_op_test_only"]
        assert torch.ops.aten.removed_op_test_only is packet
        for call in (packet, packet.default):
            with pytest.raises(_torch_compat.RemovedOpError, match="aten::removed_op_test_only"):
                call(torch.ones(1))
    finally:
        delattr(torch.ops.aten, "removed_op_test_only")


def _parses(monkeypatch) -> list[str]:
    # Counts the files read by their syntax trees.
    seen = []
    parse = _torch_compat._names_in_source

    def counted(source):
        seen.append(source)
        return parse(source)

    monkeypatch.setattr(_torch_compat, "_names_in_source", counted)
    return seen


def test_the_names_are_read_once_then_kept_on_disk_by_the_files_contents(tmp_path, monkeypatch):
    package = tmp_path / "src" / "fake_ops"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import torch\nx = torch.ops.aten.foo.bar\n")
    (package / "more.py").write_text("from torch.ops import aten\ny = aten.baz\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parses = _parses(monkeypatch)

    def names():
        _torch_compat.torchax_op_names.cache_clear()
        return _torch_compat.torchax_op_names("fake_ops")

    first = names()
    assert first == {("aten", "foo", "bar"), ("aten", "foo", None), ("aten", "baz", None)} and len(parses) == 2
    assert [p.name.startswith("fake_ops-") for p in _torch_compat.cache_folder().iterdir()] == [True]
    assert names() == first and len(parses) == 2  # read back, nothing parsed
    (package / "more.py").write_text("from torch.ops import aten\ny = aten.qux.default\n")  # another torchax
    assert names() == {("aten", "foo", "bar"), ("aten", "foo", None), ("aten", "qux", "default"),
                       ("aten", "qux", None)} and len(parses) == 4
    for kept in _torch_compat.cache_folder().iterdir():
        kept.write_text('{"not": "names"}')  # damaged: read afresh
    assert len(names()) == 4 and len(parses) == 6
    _torch_compat.torchax_op_names.cache_clear()


def test_the_names_kept_are_the_names_read_and_an_unwritable_cache_is_no_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the cache folder would be")
    parses = _parses(monkeypatch)
    _torch_compat.torchax_op_names.cache_clear()
    read = _torch_compat.torchax_op_names()
    assert parses and not (tmp_path / "file").is_dir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for _ in range(2):
        _torch_compat.torchax_op_names.cache_clear()
        assert _torch_compat.torchax_op_names() == read
    _torch_compat.torchax_op_names.cache_clear()
