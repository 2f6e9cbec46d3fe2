"""The exact set a CI stack resolved, as a constraints file `pip install -c` takes; and the checks CI makes of it.

    python .ci/constraints.py write constraints/python3.13.txt   # this environment's distributions, pinned
    python .ci/constraints.py check constraints/python3.11.txt   # exit 1 unless the install took exactly that set
    python .ci/constraints.py diff constraints/python3.13.txt    # what moved since the file was made (never fails)
    python .ci/constraints.py newest jax torch                   # exit 1 if pip took an older release than it could

The set is what ``cogvideox-torchax[test,aot]`` needs, followed through every
requirement (not the whole environment, which may hold other things).
Versions are public ones: torch's ``2.13.0+cpu`` is written ``2.13.0``, which
that wheel satisfies.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import re
import subprocess
import sys
from pathlib import Path

OURS = {"cogvideox-torchax", "pip"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(root: str = "cogvideox-torchax", extras: tuple[str, ...] = ("test", "aot")) -> dict[str, str]:
    """Every distribution ``root[extras]`` needs here, with what it needs in turn: what an install of it took."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    todo = [(root, set(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (_key(name), frozenset(wanted)) in seen:
            continue
        seen.add((_key(name), frozenset(wanted)))
        dist = importlib.metadata.distribution(name)
        if _key(name) not in OURS:
            found[_key(name)] = dist.version.split("+")[0]
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted or {""}):
                todo.append((req.name, set(req.extras)))
    return dict(sorted(found.items()))


def read(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[_key(name)] = version.strip()
    return pins


def _differences(want: dict[str, str], have: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            lines.append(f"  {name}: {want.get(name, 'absent')} in the file, {have.get(name, 'absent')} here")
    return lines


def write(path: Path) -> int:
    python = ".".join(platform.python_version_tuple()[:2])
    header = [
        f"# The exact set CI's Python {python} stack resolved and passed with, made by",
        f"# `python .ci/constraints.py write {path.as_posix()}` on {datetime.date.today()} ({platform.machine()}).",
        '# Install exactly it: pip install -c ' + path.as_posix() + ' -e ".[test,aot]"',
    ]
    body = [f"{name}=={version}" for name, version in installed().items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header + body) + "\n")
    print(f"wrote {path}: {len(body)} distributions")
    return 0


def check(path: Path) -> int:
    want = read(path)
    lines = _differences(want, {name: v for name, v in installed().items() if name in want})
    if lines:
        print(f"this environment is not {path}:", *lines, sep="\n")
        return 1
    print(f"this environment is exactly {path} ({len(read(path))} distributions)")
    return 0


def diff(path: Path) -> int:
    lines = _differences(read(path), installed())
    print(f"moved since {path} was made:" if lines else f"nothing moved since {path} was made", *lines, sep="\n")
    return 0


def newest(names: list[str]) -> int:
    """Each named distribution is the newest release pip finds for this Python (none held back by an extra)."""
    held = []
    for name in names:
        listed = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                                capture_output=True, text=True, check=True).stdout
        published = re.match(rf"{re.escape(name)} \(([^)]+)\)", listed, re.I).group(1)
        have = importlib.metadata.version(name).split("+")[0]
        print(f"{name}: installed {have}, newest published {published}")
        if have != published:
            held.append(name)
    if held:
        print(f"held back by what this install asked for: {', '.join(held)}")
    return 1 if held else 0


if __name__ == "__main__":
    verb, *args = sys.argv[1:]
    actions = {"write": write, "check": check, "diff": diff}
    sys.exit(newest(args) if verb == "newest" else actions[verb](Path(args[0])))
