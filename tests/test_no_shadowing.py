"""No name in the repository root hides an installed distribution, and the package works from any directory.

The root is on ``sys.path`` whenever a command runs from it (``python -m``,
pytest's rootdir), and a regular package or a module found there is imported
before any installed one of the same name: the Hugging Face ``kernels``
distribution (which transformers requires) was hidden by the ``kernels/``
folder this way. Checked as a class, over every name the root could give.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = "cogvideox-torchax"


def _root_names() -> dict[str, str]:
    """Every top-level name an import could find in the root, and how: "package", "module" or "namespace"."""
    suffixes = (".py", *importlib.machinery.EXTENSION_SUFFIXES)
    names = {}
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or not entry.name.split(".")[0].isidentifier():
            continue
        if entry.is_dir():
            if (entry / "__init__.py").exists():
                names[entry.name] = "package"
            elif any(entry.glob("*.py")):
                names[entry.name] = "namespace"
        elif entry.name.endswith(suffixes):
            names[entry.name.split(".")[0]] = "module"
    return names


def _others() -> dict[str, list[str]]:
    return {
        name: dists
        for name, dists in importlib.metadata.packages_distributions().items()
        if any(importlib.metadata.distribution(d).metadata["Name"] != OURS for d in dists)
    }


def _resolve_from(cwd: Path, names: list[str]) -> dict[str, list[str]]:
    """Where ``import NAME`` would load each name from, in a fresh Python started in ``cwd`` (first on its path)."""
    code = (
        "import importlib.util, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    out[name] = [] if spec is None else "
        "[p for p in [spec.origin, *(spec.submodule_search_locations or [])] if p and p != 'namespace']\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_no_regular_package_or_module_in_the_root_is_named_as_an_installed_distribution():
    others = _others()
    clashes = {name: others[name] for name, kind in _root_names().items() if kind != "namespace" and name in others}
    assert not clashes, f"these would be imported from the repository root instead of the installed ones: {clashes}"


def test_a_name_an_installed_distribution_provides_resolves_to_it_from_the_root():
    """Folders without ``__init__.py`` (``kernels/``) yield to an installed regular package of their name."""
    names = _root_names()
    assert names.get("kernels") == "namespace", names  # the user's layout: kernels/ at the root
    assert names.get("cogvideox_torchax") == "package"
    shared = sorted(set(names) & set(_others()))
    if not shared:
        pytest.skip("no distribution installed here shares a name with the root (the Hugging Face kernels one does)")
    for name, places in _resolve_from(ROOT, shared).items():
        homes = [Path(importlib.metadata.distribution(d).locate_file("")).resolve() for d in _others()[name]]
        strays = [p for p in places if not any(Path(p).resolve().is_relative_to(home) for home in homes)]
        assert places and not strays, f"`import {name}` from the root loads {places}, not {_others()[name]}'s"


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_the_package_and_its_kernels_import_from_any_directory(where, tmp_path):
    cwd = ROOT if where == "root" else tmp_path
    found = _resolve_from(cwd, ["cogvideox_torchax", "cogvideox_torchax.kernels", "cogvideox_torchax.kernels.conv"])
    kernels = ROOT / "kernels"
    assert Path(found["cogvideox_torchax.kernels.conv"][0]).resolve() == kernels / "conv.py", found
    assert all(found.values()), found


def test_the_readme_run_command_works_from_another_directory(tmp_path):
    """The README's first run command, its input path made absolute, from a directory outside the repository."""
    from tests.test_readme import _section_commands

    command = _section_commands((ROOT / "README.md").read_text(), "Run")[0].split()
    assert command[:3] == ["python", "-m", "cogvideox_torchax.decode"] and command[3].startswith("examples/"), command
    command[0], command[3] = sys.executable, str(ROOT / command[3])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    output = command[command.index("--output") + 1]
    assert (tmp_path / output).stat().st_size > 0
