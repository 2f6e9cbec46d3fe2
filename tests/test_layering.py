"""The package's import graph, read from the source: no cycle, and each layer imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "cogvideox_torchax"

# Lowest first; a module may import its own layer and those before it.
# Commands -> library facade -> VAE and memory -> plan building and options
# -> patches -> data types, profiles and kernels. A ``*`` stands for any one
# name: every family's patch package sits in the patches layer, the rest of
# its folder (record, presets, config check) on the ground.
LAYERS = (
    ("ground", ("spellings", "config", "_torch_compat", "_torchax_device", "kernels", "platforms.profiles",
                "platforms.run_plan", "platforms.hardware", "platforms.accelerators", "platforms.hlo", "parallel", "io",
                "families")),
    ("patches", ("patches", "families.*.patches")),
    ("options", ("options", "platforms.build")),
    ("runtime", ("vae", "memory")),
    ("facade", ("loading", "runtime", PACKAGE)),
    ("commands", ("cli", "decode", "encode")),
)


def _modules() -> dict[str, Path]:
    found = {}
    for base, name in ((ROOT / PACKAGE, PACKAGE), (ROOT / "kernels", f"{PACKAGE}.kernels")):
        for path in base.rglob("*.py"):
            parts = [name, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every package module ``name`` imports anywhere: at the top, in functions, under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            named.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    found = set()
    for target in named:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _under(rel: str, prefix: str) -> bool:
    """Whether the dotted name ``rel`` is ``prefix`` or below it, a ``*`` in ``prefix`` matching any one name."""
    names, wanted = rel.split("."), prefix.split(".")
    return len(names) >= len(wanted) and all(w in ("*", n) for w, n in zip(wanted, names[: len(wanted)], strict=True))


def _layer(module: str) -> int:
    rel = module.removeprefix(PACKAGE).lstrip(".") or PACKAGE
    best = None
    for level, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _under(rel, prefix):
                depth = prefix.count(".") + 1
                if best is None or depth > best[1]:
                    best = (level, depth)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layering.py: place it")
    return best[0]


def test_every_familys_patches_sit_in_the_patches_layer():
    patches, ground = _layer(f"{PACKAGE}.patches"), _layer(f"{PACKAGE}.families")
    for family in sorted(p.name for p in (ROOT / PACKAGE / "families").iterdir() if (p / "__init__.py").exists()):
        assert _layer(f"{PACKAGE}.families.{family}") == ground
        if (ROOT / PACKAGE / "families" / family / "patches").is_dir():
            assert _layer(f"{PACKAGE}.families.{family}.patches.frame_scan") == patches, family


def test_the_graph_sees_every_kind_of_import():
    graph = _graph()
    # Top level, function level and TYPE_CHECKING imports all count.
    assert "cogvideox_torchax.platforms.run_plan" in graph["cogvideox_torchax.patches.base"]  # TYPE_CHECKING
    assert "cogvideox_torchax.vae.drawn_noise" in graph["cogvideox_torchax.cli.decode"]  # inside a function
    assert "cogvideox_torchax.kernels.conv" in graph["cogvideox_torchax.platforms.run_plan"]  # kernels/ installed
    assert len(graph) > 60


def test_no_module_imports_itself_through_others():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_each_layer_imports_only_itself_and_the_layers_below():
    upward = [
        f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
        for a, targets in sorted(_graph().items())
        for b in sorted(targets)
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)
