"""Where a command's time goes, from the process's start: the summary's ``timeline``.

The parts of a run, in seconds, add up to its whole time: ``python`` (the
interpreter's start and the command's own modules, before the command
runs), ``imports`` (every module imported while it runs, by library),
``backend`` (JAX's start on its devices), ``model`` (the upstream module
built with seeded random weights, or its files read), ``checks`` (its
config and weights checked), ``weights`` (converted and placed on the
devices), ``wrap`` (the patched twin and its jits), then the command's
other stages (``compile``: a program compiled or loaded from the cache;
``decode``, ``write``, or ``decode_write`` where a streamed decode writes
while it decodes; ``read``, ``encode``, ``plan``) and ``other``, the
remainder (parsing, reading latents, checking and moving outputs in).
Time inside an import counts as the import's, whichever part it fell in.

Imports are timed by wrapping ``importlib._bootstrap._find_and_load``,
which every import statement and `importlib.import_module` call goes
through for a module not yet loaded (what ``python -X importtime``
measures), only while a command runs, on its own thread.
"""

from __future__ import annotations

import bisect
import contextlib
import importlib._bootstrap as bootstrap
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

# Libraries named in the breakdown, by top-level package. A module of any
# other package counts to the library whose import brought it in
# (``sympy`` to torch), or to ``other`` when the command imported it itself.
LIBRARIES = {
    "torch": "torch", "torchgen": "torch", "functorch": "torch",
    "jax": "jax", "jaxlib": "jax", "jax_plugins": "jax", "ml_dtypes": "jax", "opt_einsum": "jax", "libtpu": "jax",
    "torchax": "torchax",
    "diffusers": "diffusers",
    "transformers": "transformers",
    "cogvideox_torchax": "ours",
}
IMPORT_ORDER = ("torch", "jax", "torchax", "diffusers", "transformers", "ours", "other")

# The parts in the order a run goes through them (others, if any, follow).
PART_ORDER = ("python", "imports", "backend", "model", "checks", "weights", "wrap", "read", "compile", "plan",
              "decode", "encode", "write", "decode_write", "other")

# The load stage's time outside its named parts: building or reading the model.
_LOAD_REST = "model"


def process_age() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat``, 10 ms steps), or None where unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Field 22, counted after the command name (which may hold spaces and parentheses).
        started = int(stat[stat.rindex(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class ImportClock:
    """Times the imports of one thread: each outermost import's span, and every library's own seconds."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []  # (start, end) of each outermost import
        self.seconds: dict[str, float] = {}  # library -> seconds of its own modules (and those it brought in)
        self._stack: list[list[Any]] = []  # [library, seconds of nested imports] per import in progress
        self._thread = threading.get_ident()
        self._original = None

    def install(self) -> bool:
        """Starts timing; False where this Python has no ``_find_and_load`` to wrap."""
        original = getattr(bootstrap, "_find_and_load", None)
        if original is None:
            return False
        self._original = original

        def timed(name: str, import_: Any) -> Any:
            if threading.get_ident() != self._thread:
                return original(name, import_)
            library = LIBRARIES.get(name.partition(".")[0]) or (self._stack[-1][0] if self._stack else "other")
            frame = [library, 0.0]
            self._stack.append(frame)
            t0 = time.perf_counter()
            try:
                return original(name, import_)
            finally:
                t1 = time.perf_counter()
                self._stack.pop()
                self.seconds[library] = self.seconds.get(library, 0.0) + (t1 - t0 - frame[1])
                if self._stack:
                    self._stack[-1][1] += t1 - t0
                else:
                    self.spans.append((t0, t1))

        bootstrap._find_and_load = timed
        self._timed = timed
        return True

    def uninstall(self) -> None:
        if self._original is not None and getattr(bootstrap, "_find_and_load", None) is self._timed:
            bootstrap._find_and_load = self._original
        self._original = None


class Timeline:
    """One command's clock: its origin, the stages and parts it went through, its imports."""

    def __init__(self, origin: str, age: float | None) -> None:
        self.entry = time.perf_counter()
        self.origin = origin if age is not None else "command start"
        self.start = self.entry - (age or 0.0)
        self.spans: list[tuple[str, float, float, bool]] = []  # (name, start, end, is a part inside a stage)
        self.imports = ImportClock()
        self.undo: list[Callable[[], None]] = []  # what `running` puts back as it was when the run ends

    def stage(self, name: str, start: float, end: float) -> None:
        """Records a stage (``load``, ``compile``, ``decode``...); stages that overlap share their time."""
        self.spans.append((name, start, end, False))

    def part(self, name: str, start: float, end: float) -> None:
        """Records a named part inside a stage (``backend``, ``checks``, ``weights``, ``wrap``)."""
        self.spans.append((name, start, end, True))

    def breakdown(self, end: float | None = None) -> dict[str, Any]:
        """The summary's ``timeline``: ``parts_s`` (adding up to ``total_s``) and ``imports_s`` by library."""
        end = time.perf_counter() if end is None else end

        def clip(t: float) -> float:
            return min(max(t, self.entry), end)

        imports = sorted((clip(a), clip(b)) for a, b in self.imports.spans)  # outermost: disjoint
        starts = [a for a, _ in imports]
        points = sorted({self.entry, end, *(clip(t) for _, a, b, _ in self.spans for t in (a, b)),
                         *(t for span in imports for t in span)})
        parts: dict[str, float] = {"python": self.entry - self.start, "imports": 0.0}
        for a, b in zip(points, points[1:], strict=False):
            mid = (a + b) / 2
            i = bisect.bisect_right(starts, mid) - 1
            label = "imports" if i >= 0 and mid < imports[i][1] else _label(mid, self.spans)
            parts[label] = parts.get(label, 0.0) + (b - a)
        total = end - self.start
        shown = {k: round(parts[k], 3) for k in _ordered(parts) if k in ("python", "imports") or round(parts[k], 3) > 0}
        shown.pop("other", None)
        # The remainder, so that the parts as shown add up to the total as shown.
        shown["other"] = round(round(total, 3) - sum(shown.values()), 3)
        return {
            "origin": self.origin,
            "total_s": round(total, 3),
            "parts_s": shown,
            "imports_s": {k: round(self.imports.seconds[k], 3) for k in _ordered_imports(self.imports.seconds)},
        }


def _label(t: float, spans: list[tuple[str, float, float, bool]]) -> str:
    # A part inside a stage wins (the innermost, latest started); else every stage open then, in
    # the order they started (a streamed decode's "decode_write"); else the remainder.
    parts = [(s, name) for name, s, e, inner in spans if inner and s <= t < e]
    if parts:
        return max(parts)[1]
    stages = sorted((s, name) for name, s, e, inner in spans if not inner and s <= t < e)
    names = list(dict.fromkeys(_LOAD_REST if name == "load" else name for _, name in stages))
    return "_".join(names) if names else "other"


def _ordered(parts: dict[str, float]) -> list[str]:
    known = [k for k in PART_ORDER if k in parts]
    return known + sorted(k for k in parts if k not in PART_ORDER)


def _ordered_imports(seconds: dict[str, float]) -> list[str]:
    return [k for k in IMPORT_ORDER if k in seconds] + sorted(k for k in seconds if k not in IMPORT_ORDER)


def time_backend_start() -> None:
    """Records JAX's start on its devices as the ``backend`` part, wherever the run first asks JAX for them.

    Wraps ``jax._src.xla_bridge.backends`` (what every device query calls)
    until the backends have started; nothing where they have, or where this
    JAX has no such function.
    """
    from jax._src import xla_bridge  # only once the command runs: JAX takes about 1 s to import

    original = getattr(xla_bridge, "backends", None)
    if _current is None or original is None or xla_bridge.backends_are_initialized():
        return

    def timed() -> Any:
        if xla_bridge.backends_are_initialized() or threading.get_ident() != thread:
            return original()
        start = time.perf_counter()
        try:
            return original()
        finally:
            if xla_bridge.backends_are_initialized():
                record_part("backend", start, time.perf_counter())
                undo()

    def undo() -> None:
        if xla_bridge.backends is timed:
            xla_bridge.backends = original

    thread = threading.get_ident()
    xla_bridge.backends = timed
    _current.undo.append(undo)


_current: Timeline | None = None


@contextlib.contextmanager
def running(from_process_start: bool) -> Iterator[Timeline]:
    """The clock of one command run: from the process's start (the process is the command) or from now.

    Imports are timed until the block ends.
    """
    global _current
    age = process_age() if from_process_start else 0.0
    timeline = Timeline("process start" if from_process_start else "main() call", age)
    previous, _current = _current, timeline
    installed = timeline.imports.install()
    try:
        yield timeline
    finally:
        if installed:
            timeline.imports.uninstall()
        for undo in timeline.undo:
            undo()
        _current = previous


def current() -> Timeline | None:
    """The clock of the command running now, or None (the library called on its own)."""
    return _current


def record_stage(name: str, start: float, end: float) -> None:
    if _current is not None:
        _current.stage(name, start, end)


def record_part(name: str, start: float, end: float) -> None:
    if _current is not None:
        _current.part(name, start, end)


@contextlib.contextmanager
def timed_part(name: str) -> Iterator[None]:
    """Records the block as a named part of the stage it runs in."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record_part(name, start, time.perf_counter())


def lines(s: dict[str, Any]) -> list[str]:
    """The summary's lines of its ``timeline`` (none without one)."""
    t = s.get("timeline")
    if not t:
        return []
    parts = " + ".join(f"{k.replace('_', ' and ')} {v:.2f}" for k, v in t["parts_s"].items())
    out = [f"  time from {t['origin']}: {t['total_s']:.2f} s = {parts}"]
    if t["imports_s"]:
        out.append("  imports: " + ", ".join(f"{k} {v:.2f}" for k, v in t["imports_s"].items()) + " s")
    return out
