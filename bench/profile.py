"""Where a jitted program's time goes: a per-op breakdown from a JAX profile.

The profiler records one event per executed HLO instruction (XLA:CPU thunks
on the host threads, GPU/TPU kernels on the device planes), named after the
instruction and tagged with its module. The compiled HLO text says what each
instruction is; a fusion is classed by what it contains (a convolution, a
dot, a reduce, only transposes/copies, ...). Summing the events by class and
by instruction gives the breakdown the bench prints.

Each moment of the program's wall time is charged to one op: the latest
started of the ops running then or, when none is, the op that ended last.
The second rule matters on XLA:CPU, where a convolution's event ends before
its worker threads finish: the gap that follows is the convolution's time
(measured on the 2b decode: op events alone covered 37 % of the wall time,
the gaps all followed convolutions). So the categories add up to the wall
time of the call, and concurrent ops are not counted twice.
"""

from __future__ import annotations

import collections
import glob
import heapq
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any

import jax

from cogvideox_torchax.platforms import hlo

# Opcodes that only contain other ops (their events span their children's).
_CONTAINERS = {"while", "conditional", "call", "async-start", "async-done", "async-update"}
_MOVEMENT = {"pad", "concatenate", "slice", "dynamic-slice", "dynamic-update-slice", "gather", "scatter", "select"}
_LAYOUT = {"transpose", "copy", "bitcast", "reshape", "broadcast", "parameter", "tuple", "get-tuple-element"}
_LAYOUT |= {"constant", "iota"}

_COMPUTATION_RE = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*[({].*\{\s*$")
_INSTRUCTION_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_CALLS_RE = re.compile(r"calls=%?([\w.\-]+)")
_TARGET_RE = re.compile(r'custom_call_target="([^"]+)"')


def _library_call(target: str) -> str:
    """The category of a custom call by its target: on GPUs, XLA's convolutions and GEMMs are library calls.

    On the CPU, `kernels.host_conv` calls the host's torch through a buffer callback.
    """
    t = target.lower()
    if "conv" in t:  # __cudnn$convForward, __cudnn$convBiasActivationForward, ...
        return "convolution"
    if t == hlo.HOST_CONV_TARGET:  # kernels.host_conv's convolution
        return "convolution"
    if "gemm" in t or "matmul" in t or "blas" in t or "fmha" in t:  # __cublas$gemm, __cublas$lt$matmul, cuDNN fMHA
        return "matmul"
    return "other"


def _parse_hlo(hlo_text: str) -> tuple[dict[str, str], dict[str, list[str]], dict[str, str]]:
    """Maps instruction -> opcode, computation -> its opcodes, fusion -> called computation.

    A custom call's opcode is its category (`_library_call`) prefixed by ``custom-call:``.
    """
    opcode: dict[str, str] = {}
    body: dict[str, list[str]] = collections.defaultdict(list)
    calls: dict[str, str] = {}
    current = None
    for line in hlo_text.splitlines():
        m = _COMPUTATION_RE.match(line)
        if m and "=" not in line.split("{")[0]:
            current = m.group(1)
            continue
        m = _INSTRUCTION_RE.match(line)
        if not m:
            continue
        name, op = m.groups()
        t = _TARGET_RE.search(line) if op == "custom-call" else None
        op = f"custom-call:{_library_call(t.group(1))}" if t else op
        opcode[name] = op
        if current is not None:
            body[current].append(op)
        c = _CALLS_RE.search(line)
        if op == "fusion" and c:
            calls[name] = c.group(1)
    return opcode, body, calls


def _classify(ops: list[str]) -> str:
    kinds = set(ops)
    if "convolution" in kinds or "custom-call:convolution" in kinds:
        return "convolution"
    if "dot" in kinds or "custom-call:matmul" in kinds:
        return "matmul"
    if "reduce" in kinds or "reduce-window" in kinds:
        return "reduction"
    if kinds <= _LAYOUT:
        return "transpose/copy"
    if kinds <= _LAYOUT | _MOVEMENT:
        return "pad/slice/concat"
    return "elementwise"


def categorize(hlo_text: str) -> dict[str, str]:
    """Instruction name -> breakdown category (containers like ``while`` are left out)."""
    opcode, body, calls = _parse_hlo(hlo_text)
    out = {}
    for name, op in opcode.items():
        if op in _CONTAINERS:
            continue
        if op == "fusion" and name in calls:
            out[name] = _classify(body.get(calls[name], []))
        elif op.startswith("custom-call"):
            out[name] = op.partition(":")[2] or "other"
        else:
            out[name] = _classify([op])
    return out


def _module_name(hlo_text: str) -> str:
    m = re.match(r"\s*HloModule\s+([\w.\-]+)", hlo_text)
    return m.group(1) if m else ""


def _events(trace_dir: str, module: str) -> list[tuple[int, int, str]]:
    from jax.profiler import ProfileData

    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return []
    data = ProfileData.from_file(files[0])
    by_plane: dict[str, list[tuple[str, float]]] = {}
    for plane in data.planes:
        found = []
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                op = stats.get("hlo_op")
                if op is None or (module and stats.get("hlo_module") not in (module, None)):
                    continue
                start = int(event.start_ns)
                found.append((start, start + int(event.duration_ns), str(op)))
        if found:
            by_plane[plane.name] = found
    # Accelerators record kernels on device planes (and launches on the
    # host): count the device side only, so nothing is counted twice.
    device = [ev for name, evs in by_plane.items() if name.startswith("/device:") for ev in evs]
    return device or [ev for evs in by_plane.values() for ev in evs]


def wall_time_by_op(intervals: list[tuple[int, int, str]]) -> dict[str, tuple[float, int]]:
    """Charges every nanosecond between the first start and the last end to one op.

    Args:
        intervals: ``(start_ns, end_ns, op)`` per executed op.

    Returns:
        ``{op: (ns charged, times run)}``; the charges sum to the span.
    """
    events = sorted(intervals)
    bounds = sorted({t for s, e, _ in events for t in (s, e)})
    charged: dict[str, float] = collections.defaultdict(float)
    runs = collections.Counter(op for _, _, op in events)
    active: list[tuple[int, int, str]] = []  # heap on -start: the latest started on top
    last_end, last_op = -1, None
    i = 0
    for lo, hi in zip(bounds, bounds[1:], strict=False):  # consecutive boundaries
        while i < len(events) and events[i][0] <= lo:
            s, e, op = events[i]
            heapq.heappush(active, (-s, e, op))
            i += 1
        while active and active[0][1] <= lo:  # ended: remember the last one to end
            _, e, op = heapq.heappop(active)
            if e >= last_end:
                last_end, last_op = e, op
        owner = active[0][2] if active else last_op
        if owner is not None:
            charged[owner] += hi - lo
    return {op: (charged[op], runs[op]) for op in runs}


def busy_ns(intervals: list[tuple[int, int, str]]) -> int:
    """Nanoseconds in which at least one op ran (the union of the intervals)."""
    busy, end = 0, None
    for s, e, _ in sorted(intervals):
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def op_breakdown(run: Callable[[], Any], hlo_text: str, top: int = 8) -> dict[str, Any] | None:
    """Profiles one call of ``run`` and sums its op time by category and by op.

    Args:
        run: calls the compiled program once and blocks until it is done.
        hlo_text: the compiled program's HLO (``compiled.as_text()``).
        top: how many of the slowest instructions to list.

    Returns:
        ``{"total_ms", "busy_ms", "categories": [{category, ms, share, count}],
        "top_ops": [{op, category, ms, count}]}`` (``total_ms`` is the
        call's wall time from its first op to its last; ``busy_ms`` the part
        of it in which some op's event was open: on a GPU the rest is the
        device idle between kernels, on XLA:CPU mostly a convolution's
        worker threads after its event ended) or None when the profiler
        recorded no op events on this backend.
    """
    module = _module_name(hlo_text)
    kinds = categorize(hlo_text)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            run()
        events = _events(d, module)
    times: dict[str, float] = {}
    counts: dict[str, int] = {}
    # Containers (a while loop's own event) are left out: the ops in their
    # bodies have events of their own.
    ops = [ev for ev in events if ev[2] in kinds]
    for op, (ns, runs) in wall_time_by_op(ops).items():
        times[op], counts[op] = ns / 1e6, runs
    total = sum(times.values())
    if not total:
        return None
    cat_ms: dict[str, float] = collections.defaultdict(float)
    cat_n: dict[str, int] = collections.Counter()
    for op, ms in times.items():
        cat_ms[kinds[op]] += ms
        cat_n[kinds[op]] += counts[op]
    categories = [
        {"category": c, "ms": cat_ms[c], "share": cat_ms[c] / total, "count": cat_n[c]}
        for c in sorted(cat_ms, key=cat_ms.get, reverse=True)
    ]
    slowest = sorted(times, key=times.get, reverse=True)[:top]
    top_ops = [{"op": op, "category": kinds[op], "ms": times[op], "count": counts[op]} for op in slowest]
    return {"total_ms": total, "busy_ms": busy_ns(ops) / 1e6, "categories": categories, "top_ops": top_ops}


def format_breakdown(system: str, breakdown: dict[str, Any]) -> list[str]:
    """Markdown lines for one system's breakdown."""
    busy = breakdown.get("busy_ms")  # reports before it was recorded lack it
    busy_note = f" ({busy:.0f} ms of it with an op's event open)" if busy is not None else ""
    lines = [
        f"### {system}: {breakdown['total_ms']:.0f} ms from first op to last{busy_note}",
        "",
        "| category | ms | share | ops run |",
    ]
    lines.append("|---|---|---|---|")
    for c in breakdown["categories"]:
        lines.append(f"| {c['category']} | {c['ms']:.1f} | {100 * c['share']:.1f} % | {c['count']} |")
    lines += ["", "| slowest op | category | ms | runs |", "|---|---|---|---|"]
    for o in breakdown["top_ops"]:
        lines.append(f"| `{o['op']}` | {o['category']} | {o['ms']:.1f} | {o['count']} |")
    return lines
