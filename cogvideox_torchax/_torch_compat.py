"""Lets torchax import on every torch release in the supported range.

torchax names ATen ops by attribute while it imports (its op registry's
decorators, its autocast policy, its decomposition list). Whenever a torch
release removes an op or one of its overloads (2.13 the named-tensor
overloads such as ``aten.prod.dim_Dimname``, 2.14 the ``aten.cholesky`` and
``aten.qr`` packets), that lookup raises and ``import torchax`` fails.

So the names are not kept by hand: `torchax_op_names` reads them from
torchax's own source (its syntax trees, without importing it), and
`install_placeholders` gives each one this torch lacks an inert stand-in,
hashable and distinct from every real op, so a table keyed by it can never
match a dispatched call. Calling one raises `RemovedOpError` naming the op.
On a torch that has an op, nothing about it is touched. Every import of
torchax in the project goes through `import_torchax`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

# Namespaces torch defines completely when it is imported. Others (e.g.
# ``torchvision``) are filled by later imports, where a placeholder would
# shadow the real op, so they are never touched.
CORE_NAMESPACES = ("aten", "prims")


class RemovedOpError(NotImplementedError):
    """An op torchax names but the installed torch does not define was called."""


class RemovedOverload:
    """Stands in for an ATen overload that this torch build does not define.

    Hashable and distinct from every real op; `torch._decomp.get_decompositions`
    skips it because it is not an `OpOverload`.
    """

    __slots__ = ("qualified_name",)

    def __init__(self, qualified_name: str):
        self.qualified_name = qualified_name

    def __repr__(self) -> str:
        return f"RemovedOverload({self.qualified_name!r})"

    def __call__(self, *args, **kwargs):
        import torch

        raise RemovedOpError(
            f"{self.qualified_name} is not defined by torch {torch.__version__}; "
            "torchax names it, but nothing in this project dispatches it"
        )


class RemovedPacket(RemovedOverload):
    """Stands in for a whole ATen op (packet) this torch does not define.

    Its overloads (``.default`` and any other attribute) are `RemovedOverload`
    placeholders of their own, made once each.
    """

    __slots__ = ("_overloads",)

    def __init__(self, qualified_name: str):
        super().__init__(qualified_name)
        self._overloads: dict[str, RemovedOverload] = {}

    def __repr__(self) -> str:
        return f"RemovedPacket({self.qualified_name!r})"

    def __getattr__(self, name: str) -> RemovedOverload:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._overloads.setdefault(name, RemovedOverload(f"{self.qualified_name}.{name}"))

    def overloads(self) -> list[str]:
        return []


def _chain(node: ast.AST) -> list[str] | None:
    # `a.b.c` as ["a", "b", "c"]; None for anything not a plain name chain.
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _namespace_of(parts: list[str], aliases: dict[str, str]) -> tuple[str, list[str]] | None:
    # ("aten", rest) for torch.ops.aten.rest, torch._ops.ops.aten.rest or alias.rest.
    for prefix in (["torch", "ops"], ["torch", "_ops", "ops"]):
        n = len(prefix)
        if parts[:n] == prefix and len(parts) > n:
            return parts[n], parts[n + 1 :]
    if parts[0] in aliases:
        return aliases[parts[0]], parts[1:]
    return None


def _names_in_source(source: str) -> set[tuple[str, str, str | None]]:
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        # aten = torch.ops.aten / torch._ops.ops.aten; from torch.ops import aten
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            parts = _chain(node.value)
            found = _namespace_of(parts, {}) if parts else None
            if found and not found[1]:
                aliases[node.targets[0].id] = found[0]
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch.ops", "torch._ops.ops"):
            for name in node.names:
                aliases[name.asname or name.name] = name.name
    names: set[tuple[str, str, str | None]] = set()
    for node in ast.walk(tree):
        parts = _chain(node) if isinstance(node, ast.Attribute) else None
        found = _namespace_of(parts, aliases) if parts else None
        if found and found[1]:
            namespace, rest = found
            names.add((namespace, rest[0], rest[1] if len(rest) > 1 else None))
    return names


@functools.cache
def torchax_op_names(package: str = "torchax") -> frozenset[tuple[str, str, str | None]]:
    """Every ``(namespace, op, overload or None)`` that ``package``'s source names under ``torch.ops``.

    Read from the installed package's files without importing it. Reading
    their syntax trees is the slowest part of importing this project, so the
    result is kept on disk (`cache_folder`), keyed by the files' contents and
    this module's own: a later process with the same files reads it back.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed")
    sources = {}
    for location in spec.submodule_search_locations:
        for path in sorted(Path(location).rglob("*.py")):
            sources[path.relative_to(location).as_posix()] = path.read_bytes()
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{sys.version_info[0]}.{sys.version_info[1]}\0{package}".encode())
    for name, source in sources.items():
        digest.update(b"\0%s\0%d\0" % (name.encode(), len(source)))
        digest.update(source)
    kept = cache_folder() / f"{package}-{digest.hexdigest()[:32]}.json"
    names = _read_names(kept)
    if names is None:
        names = frozenset().union(*(_names_in_source(source.decode("utf-8")) for source in sources.values()))
        _write_names(kept, names)
    return names


def cache_folder() -> Path:
    """Where `torchax_op_names` keeps what it read: ``$XDG_CACHE_HOME/cogvideox_torchax/torchax_ops`` (``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cogvideox_torchax" / "torchax_ops"


def _read_names(path: Path) -> frozenset[tuple[str, str, str | None]] | None:
    # None for no file, or one that is not what `_write_names` writes (then read afresh).
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(rows, list) and all(
        isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], str)
        and (r[2] is None or isinstance(r[2], str)) for r in rows
    )
    return frozenset(tuple(r) for r in rows) if ok else None


def _write_names(path: Path, names: frozenset[tuple[str, str, str | None]]) -> None:
    # Whole or not at all (a temporary file moved in); a folder that cannot be written is no error.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(sorted(names, key=str), f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass


def _is_packet_method(name: str) -> bool:
    import torch

    # e.g. `torch.ops.aten.add.overloads()`: a method of the packet, not an overload.
    return hasattr(torch._ops.OpOverloadPacket, name)


def install_placeholders(names=None) -> list[str]:
    """Gives each op or overload in ``names`` that this torch lacks a placeholder.

    Only the core namespaces (`CORE_NAMESPACES`) are touched. Idempotent; a
    no-op where torch defines everything named.

    Args:
        names: ``(namespace, op, overload or None)`` triples; default: what
            torchax's source names (`torchax_op_names`).

    Returns:
        The qualified names (``"aten::cholesky"``, ``"aten::prod.dim_Dimname"``)
        that have a placeholder after this call, sorted.
    """
    import torch

    installed = set()
    for namespace, op, overload in sorted(torchax_op_names() if names is None else names, key=str):
        if namespace not in CORE_NAMESPACES:
            continue
        space = getattr(torch.ops, namespace)
        packet = space.__dict__.get(op)
        if packet is None:
            try:
                packet = getattr(space, op)
            except AttributeError:
                # _OpNamespace.__getattr__ runs only when normal lookup fails,
                # so an instance attribute answers `torch.ops.aten.<op>` from now on.
                packet = RemovedPacket(f"{namespace}::{op}")
                setattr(space, op, packet)
        if isinstance(packet, RemovedPacket):
            installed.add(packet.qualified_name)
            continue
        if overload is None or _is_packet_method(overload) or overload in packet.overloads():
            continue
        existing = packet.__dict__.get(overload)
        if not isinstance(existing, RemovedOverload):
            setattr(packet, overload, RemovedOverload(f"{namespace}::{op}.{overload}"))
        installed.add(f"{namespace}::{op}.{overload}")
    return sorted(installed)


def import_torchax() -> types.ModuleType:
    """Imports torchax after making the installed torch acceptable to it.

    Every module of this project imports torchax through this function,
    which also keeps torchax from registering "jax" as torch's accelerator
    (`cogvideox_torchax._torchax_device`).

    Returns:
        The `torchax` module.
    """
    from cogvideox_torchax import _torchax_device

    install_placeholders()
    return _torchax_device.import_confined()
