"""The results-page draft of `bench.suite`: each step's JSON as rows of one table, the failures, the header.

`ROWS` maps a step's ``kind`` to what reads its record (``stdout_json``:
the JSON its command printed) into rows of ``(what, {system: cell})``; the
table has a column per system (`bench.systems.RECORDS`' ``column``), the
Flax port's saying "CogVideoX only" on other families' rows. A decode's
rows name the fastest torch row and give ours' speedup over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.suite_steps import FLAX_PORT_FAMILIES
from bench.systems import RECORDS

COLUMNS = {s.name: s.column for s in RECORDS}

# Each kind turns its step's JSON into table rows: (what, {system: cell}).

Rows = list[tuple[str, dict[str, str]]]


def _n(v: float | None, fmt: str = ".3g") -> str:
    return "-" if v is None else format(v, fmt)


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v / 2**30:.2f}"


def _dims(shape: list[int] | None) -> str:
    return "-" if shape is None else "(" + ",".join(map(str, shape)) + ")"


def _short_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype)


def _by_system(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    first = report.get("shape")
    return {r["system"]: r for r in report.get("results", []) if r.get("shape") == first or r.get("error")}


def _cells(rows: dict[str, dict[str, Any]], cell: Callable[[dict[str, Any]], str], first: bool) -> dict[str, str]:
    out = {}
    for system, row in rows.items():
        if row.get("error"):
            out[system] = f"failed: {row['error'][:120]}" if first else ""
        else:
            out[system] = cell(row)
    return out


def _decode_rows(record: dict[str, Any]) -> Rows:
    report = record["stdout_json"]
    rows = _by_system(report)
    ours = rows.get("torchax", {})
    repeats = max((len(r.get("steady_all_s") or []) for r in rows.values()), default=0)
    analytic = next((r["analytic_conv_flops"] for r in rows.values() if r.get("analytic_conv_flops")), None)
    peak = report.get("peak_tflops")

    def rate(r: dict[str, Any]) -> str:
        if r.get("tflops_per_s") is None:
            return "-"
        share = f" ({r['pct_of_peak']:.1f} % of {peak:.4g})" if r.get("pct_of_peak") is not None else ""
        return f"{r['tflops_per_s']:.3g}{share}"

    def peak_cell(r: dict[str, Any]) -> str:
        if r.get("peak_device_bytes") is None and r.get("peak_device_bytes_at_most") is not None:
            return "<=" + _gib(r["peak_device_bytes_at_most"])
        return _gib(r.get("peak_device_bytes"))

    head = f"{record['label']}, {_dims(report['shape'])} {_short_dtype(report['dtype'])}, steady (median of {repeats})"
    best = next((b for b in report.get("fastest_torch") or [] if b["shape"] == report["shape"]), None)
    fastest = {}
    if best:  # the report's own pick (`bench.report.fastest_torch`), named in its column
        fastest[best["system"]] = f"the fastest torch row ({best['steady_s']:.3f} s)"
        if best.get("ours_speedup"):
            fastest["torchax"] = f"{best['ours_speedup']:.3g}x faster"
    return [
        (head, _cells(rows, lambda r: f"{_n(r.get('steady_s'), '.3f')} s", True)),
        ("same, compile / first call", _cells(rows, lambda r: f"{_n(r.get('compile_s'))} / "
                                                         f"{_n(r.get('first_call_s'))} s", False)),
        ("same, compiled temp / peak device", _cells(rows, lambda r: f"{_gib(r.get('temp_bytes'))} / "
                                                                f"{peak_cell(r)} GiB", False)),
        (f"same, TFLOP/s ({_n(analytic and analytic / 1e12, '.4g')} TFLOP analytic)", _cells(rows, rate, False)),
        ("same, time over ours", _cells(rows, lambda r: _n(r.get("time_vs_ours"), ".3g"), False) if ours else {}),
        ("same, ours against the fastest torch row", fastest),
    ]  # fmt: skip


def _parity_rows(record: dict[str, Any]) -> Rows:
    report = record["stdout_json"]
    rows = _by_system(report)
    what = f"{_short_dtype(report['dtype'])} vs upstream fp32 on the CPU, {_dims(report['shape'])}, max / mean abs"
    return [(what, _cells(rows, lambda r: f"{_n(r.get('max_abs_err'))} / {_n(r.get('mean_abs_err'), '.2g')}", True))]


def _cold_warm_rows(record: dict[str, Any]) -> Rows:
    report = record["stdout_json"]
    rows = _by_system(report)
    t, h, w = report["shape"][2:]

    def call(r: dict[str, Any]) -> str:
        if "cold_first_frame_s" not in r:
            return "-"
        return (
            f"{_n(r['cold_first_frame_s'])} / {_n(r['warm_first_frame_s'])} s (compile "
            f"{_n(r['cold_compile_s'])} / {_n(r['warm_compile_s'])} s; warm cache hits {r['warm_cache_hits']}, "
            f"misses {r['warm_cache_misses']})"
        )

    def process(r: dict[str, Any]) -> str:
        return f"{_n(r['cold_process_s'])} / {_n(r['warm_process_s'])} s" if "cold_process_s" in r else "-"

    return [
        (f"cold and warm start, {record['label']} {t}x{h}x{w}: first frame from the call, cold / warm",
         _cells(rows, call, True)),
        ("same, from process start, cold / warm", _cells(rows, process, False)),
    ]  # fmt: skip


def _profile_rows(record: dict[str, Any]) -> Rows:
    report = record["stdout_json"]
    rows = _by_system(report)

    def shares(r: dict[str, Any]) -> str:
        p = r.get("profile")
        if not p:
            return "no op events recorded"
        busy = f", {p['busy_ms']:.0f} ms busy" if p.get("busy_ms") is not None else ""
        cats = ", ".join(f"{c['category']} {100 * c['share']:.0f} %" for c in p["categories"][:4])
        return f"{p['total_ms']:.0f} ms{busy}: {cats}"

    what = (
        f"per-op profile, {record['label']} {_dims(report['shape'])} {_short_dtype(report['dtype'])}, one steady call"
    )
    return [(what, _cells(rows, shares, True))]


def profiles(suite: dict[str, Any]) -> list[str]:
    """The full breakdown of each profiled system (`bench.profile.format_breakdown`), for the page's own section."""
    from bench.profile import format_breakdown

    lines: list[str] = []
    for record in suite["steps"]:
        report = record.get("stdout_json") or {}
        for row in report.get("results", []):
            if row.get("profile"):
                lines += ["", *format_breakdown(f"{record['name']}, {row['system']}", row["profile"])]
    return lines


def _stream_rows(record: dict[str, Any]) -> Rows:
    report = record["stdout_json"]
    rows = {r["system"]: r for r in report["rows"]}
    t, h, w = report["rows"][0]["shape"][2:]

    def then(r: dict[str, Any]) -> str:
        where = f" ({r['device']}, {_short_dtype(r['dtype'])})" if "device" in r else ""
        return f"{r['decode_s']:.3f} + {r['write_s']:.3f} = {r['end_to_end_s']:.3f} s{where}"

    out: Rows = []
    what = f"latents -> mp4, {record['label']} {t}x{h}x{w} {report['dtype']}, decode then write"
    cells = {}
    if "whole" in rows:
        cells["torchax"] = then(rows["whole"])
    if "torch" in rows:
        cells["torch"] = then(rows["torch"])
    out.append((what, cells))
    if "streamed" in rows:
        r = rows["streamed"]
        out.append(("same, streamed (the command's default)", {"torchax": (
            f"first frame {r['first_frame_s']:.3f} s, end {r['end_to_end_s']:.3f} s, "
            f"{100 * r['write_hidden']:.0f} % of the write hidden")}))  # fmt: skip
    return out


def _readme_rows(record: dict[str, Any]) -> Rows:
    report = record["stdout_json"]
    shape = _dims(report["latents_shape"])
    return [(f"README main command ({report.get('dtype')}, latents {shape})", {"torchax": (
        f"load {report['load_s']:.2f} s, compile {report['compile_s']:.2f} s (cache {report.get('compile_cache')}), "
        f"decode {report['decode_s']:.2f} s, write {report['write_s']:.2f} s; the process {record['wall_s']:.1f} s, "
        f"exit {record['rc']}")})]  # fmt: skip


ROWS: dict[str, Callable[[dict[str, Any]], Rows]] = {  # a step's kind -> its record's rows
    "decode": _decode_rows,
    "parity": _parity_rows,
    "cold-warm": _cold_warm_rows,
    "profile": _profile_rows,
    "stream": _stream_rows,
    "readme": _readme_rows,
}


def table(suite: dict[str, Any]) -> list[str]:
    """The page's table: one line per row of each step, a column per system."""
    lines = ["| run | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for record in suite["steps"]:
        report = record.get("stdout_json")
        if record.get("skipped"):
            continue
        if report is None:
            lines.append(f"| {record['name']}: failed ({record.get('error', '')[:160]}) |" + " |" * len(COLUMNS))
            continue
        try:
            rows = ROWS[record["kind"]](record)
        except (KeyError, TypeError, IndexError) as e:  # a report without the figures its row reads
            lines.append(f"| {record['name']}: unreadable report ({type(e).__name__}: {e}) |" + " |" * len(COLUMNS))
            continue
        for what, cells in rows:
            if not cells:
                continue
            row = []
            for system in COLUMNS:
                if system == "flax" and record["family"] not in FLAX_PORT_FAMILIES:
                    row.append("CogVideoX only")
                else:
                    row.append(cells.get(system, ""))
            lines.append(f"| {what} | " + " | ".join(row) + " |")
    return lines


def failures(suite: dict[str, Any]) -> list[str]:
    """Each failed step, and each system that failed inside a step that ran."""
    out = []
    for record in suite["steps"]:
        if record.get("error"):
            out.append(f"{record['name']}: {record['error']}")
        for row in (record.get("stdout_json") or {}).get("results", []):
            if row.get("error"):
                out.append(f"{record['name']}, {row['system']} (exit code {row.get('returncode')}): {row['error']}")
    return out


def draft(suite: dict[str, Any]) -> str:
    """The results page in Markdown: what was measured, where and how, stated once; the table; the failures."""
    hw = suite["hardware"]
    machine = "; ".join(hw.get("gpus", [])) or suite.get("device") or "?"
    versions_line = ", ".join(f"{k} {v}" for k, v in suite["versions"].items())
    where = suite["project"]
    lines = [
        f"# {suite.get('device') or machine}: the standard set (draft, {suite['date']})",
        "",
        "Written by `bench.suite`"
        + (" with `--quick` (tiny config, a smoke run: no figure here is a result)" if suite["quick"] else "")
        + "; check every figure against `suite.json` before publishing.",
        "",
        f"- Hardware: {machine}; CPU {hw.get('cpu')}, {hw.get('cores')} cores",
        f"- Device (JAX): {suite.get('device')}",
        f"- Versions: {versions_line}",
        f"- Project: commit {suite['commit'] or 'unknown (bench/ outside a git checkout)'}, "
        f"{where.get('installed')}, {where.get('location')}",
        f"- Weights: seeded random (`random:PRESET`), {'the tiny' if suite['quick'] else 'real'} configs; "
        f"dtype {suite['dtype']} (the README command: its own, fp32)",
        f"- Suite: `{suite['command']}` ({len(suite['steps'])} steps, each in its own process)",
        "",
        "Commands (from the project's root, or any folder with `bench/` on the path):",
        "",
        "```bash",
    ]
    lines += [f"{r['command']}  # {r['name']}" for r in suite["steps"] if r.get("command")]
    lines += ["```", "", *table(suite)]
    breakdowns = profiles(suite)
    if breakdowns:
        lines += ["", "## Per-op profiles", *breakdowns]
    lines += ["", "## Failures", ""]
    lines += [f"- {f}" for f in failures(suite)] or ["None."]
    skipped = [f"- {r['name']}: {r['skipped']}" for r in suite["steps"] if r.get("skipped")]
    if skipped:
        lines += ["", "## Skipped", "", *skipped]
    lines += ["", "| step | exit code | wall s |", "|---|---|---|"]
    lines += [f"| {r['name']} | {r.get('rc', '-')} | {r.get('wall_s', '-')} |" for r in suite["steps"]]
    return "\n".join(lines) + "\n"
