"""What `bench.decode` makes of its measurements: derived figures, the table, the plot."""

from __future__ import annotations

import statistics
from typing import Any

from bench.systems import BY_NAME, TORCH_ROWS

# XLA's FLOP count is used for the rate while it is within this share of the
# analytic convolution count. Beyond it, XLA missed work (its GPU cost
# analysis counts about nothing for cuDNN convolutions) or counted a lot of
# waste, and the analytic count is the better measure of the decode's work.
FLOPS_TOLERANCE = 0.05


def rate_flops(xla: float | None, analytic: float | None) -> tuple[float | None, str | None]:
    """The FLOPs a TFLOP/s figure divides by, and where they come from (``"xla"`` or ``"analytic"``)."""
    if analytic and (not xla or abs(xla / analytic - 1) > FLOPS_TOLERANCE):
        return analytic, "analytic"
    if xla:
        return xla, "xla"
    return None, None


def fastest_torch(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest torch row of one shape's rows (`bench.systems.TORCH_ROWS`, by steady time) and ours against it.

    ``ours_speedup`` is its steady time over ours (null without ours). None
    where no torch row has a steady time (none ran, or each one failed).
    """
    timed = [r for r in rows if r["system"] in TORCH_ROWS and r.get("steady_s")]
    if not timed:
        return None
    best = min(timed, key=lambda r: r["steady_s"])
    ours = next((r for r in rows if r["system"] == "torchax" and r.get("steady_s")), None)
    return {
        "shape": best["shape"],
        "system": best["system"],
        "steady_s": best["steady_s"],
        "ours_speedup": best["steady_s"] / ours["steady_s"] if ours else None,
    }


def derive(rows: list[dict[str, Any]], peak_tflops: float | None) -> dict[str, Any] | None:
    """Steady medians, TFLOP/s, share of peak and time relative to ours and to the fastest torch row, in place.

    Every row keeps both FLOP counts: ``flops`` (XLA's cost analysis, null
    for the torch rows) and ``analytic_conv_flops``; ``flops_source`` says
    which one its TFLOP/s and % of peak use (`rate_flops`). A torch row has
    no count of its own and runs the same decode: its rate uses the analytic
    count (ours' XLA count when there is no analytic one). Returns the
    shape's `fastest_torch`.
    """
    for row in rows:
        times = row.get("steady_all_s")
        row["steady_s"] = statistics.median(times) if times else None
    ours = next((r for r in rows if r["system"] == "torchax"), {})
    same_work = ours.get("flops")
    for row in rows:
        xla, analytic = row.get("flops"), row.get("analytic_conv_flops")
        row["flops_vs_analytic"] = xla / analytic if xla and analytic else None
        flops, row["flops_source"] = rate_flops(xla, analytic)
        if flops is None and same_work:  # a torch row without an analytic count: ours' (same decode)
            flops, row["flops_source"] = same_work, "xla"
        row["tflops_per_s"] = flops / row["steady_s"] / 1e12 if flops and row["steady_s"] else None
        row["pct_of_peak"] = 100 * row["tflops_per_s"] / peak_tflops if row["tflops_per_s"] and peak_tflops else None
        row["time_vs_ours"] = row["steady_s"] / ours["steady_s"] if ours.get("steady_s") and row["steady_s"] else None
    best = fastest_torch(rows)
    for row in rows:
        row["time_vs_fastest_torch"] = row["steady_s"] / best["steady_s"] if best and row["steady_s"] else None
        for key in (
            "compile_s",
            "first_call_s",
            "temp_bytes",
            "argument_bytes",
            "peak_device_bytes",
            "flops",
            "analytic_conv_flops",
        ):
            row.setdefault(key, None)
    return best


# -- the table ---------------------------------------------------------------------


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "GiB":
        return f"{v / 2**30:.3f}"
    if unit == "G":
        return f"{v / 1e9:.4g}"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.4g}"
    return str(v)


def _cell(row: dict[str, Any], key: str, unit: str) -> str:
    if key == "peak_device_bytes" and row.get(key) is None and row.get("peak_device_bytes_at_most") is not None:
        return "<=" + _fmt(row["peak_device_bytes_at_most"], unit)  # an earlier system's peak was higher
    return _fmt(row.get(key), unit)


COLUMNS = [
    ("load_s", "load s", ""),
    ("compile_s", "compile s", ""),
    ("first_call_s", "first call s", ""),
    ("steady_s", "steady s", ""),
    ("temp_bytes", "temp GiB", "GiB"),
    ("argument_bytes", "args GiB", "GiB"),
    ("peak_device_bytes", "peak GiB", "GiB"),
    ("flops", "GFLOP (XLA)", "G"),
    ("analytic_conv_flops", "conv GFLOP", "G"),
    ("flops_vs_analytic", "XLA/conv FLOP", ""),
    ("flops_source", "rate from", ""),
    ("tflops_per_s", "TFLOP/s", ""),
    ("pct_of_peak", "% peak", ""),
    ("max_abs_err", "max err", ""),
    ("mean_abs_err", "mean err", ""),
    ("time_vs_ours", "time/ours", ""),
    ("time_vs_fastest_torch", "time/fastest torch", ""),
]
COLD_WARM_COLUMNS = [
    ("cold_first_frame_s", "cold first frame s", ""),
    ("warm_first_frame_s", "warm first frame s", ""),
    ("warm_process_s", "warm process s", ""),
    ("warm_cache_hits", "warm cache hits", ""),
    ("warm_cache_misses", "warm cache misses", ""),
]


def print_table(report: dict[str, Any]) -> None:
    print(f"# {report['command']}")
    print(f"# commit {report['commit']}, device {report['device']}, mesh {report['mesh']}, {report['dtype']}")
    print(f"# versions {report['versions']}")
    if report.get("xla_flags"):
        print(f"# XLA_FLAGS={report['xla_flags']}")
    if report.get("peak_tflops"):
        print(f"# peak {report['peak_tflops']:.3g} TFLOP/s ({report['peak_source']})")
    print(
        f"# TFLOP/s and % peak divide XLA's FLOPs ('rate from' xla) unless they are missing or more than "
        f"{100 * FLOPS_TOLERANCE:.0f} % off the analytic convolution FLOPs (then 'analytic')"
    )
    if report.get("plan") is not None:
        print(f"# plan {report['plan']}")
    if report.get("isolated"):
        print("# each system in its own process (--isolate)")
    for system, why in (report.get("not_run") or {}).items():
        print(f"# {system}: {why}")
    for row in report["results"]:
        if row.get("error"):
            print(f"# {row['system']} failed (exit code {row.get('returncode')}): {row['error']}")
    for best in report.get("fastest_torch") or []:
        speedup = f"; ours {best['ours_speedup']:.3g}x faster" if best.get("ours_speedup") else ""
        print(f"# fastest torch row at {tuple(best['shape'])}: {best['system']}, {best['steady_s']:.3g} s{speedup}")
    cols = COLUMNS + (COLD_WARM_COLUMNS if any("cold_first_frame_s" in r for r in report["results"]) else [])
    print("| system | latents | " + " | ".join(c[1] for c in cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for row in report["results"]:
        vals = [_cell(row, key, unit) for key, _, unit in cols]
        latents = tuple(row["shape"]) if row["shape"] else "-"
        print(f"| {row['system']} | {latents} | " + " | ".join(vals) + " |")
    profiled = [r for r in report["results"] if r.get("profile")]
    if profiled:
        from bench.profile import format_breakdown

        print("\n## Where the time goes (one steady call)")
        for row in profiled:
            print()
            print("\n".join(format_breakdown(f"{row['system']} {tuple(row['shape'])}", row["profile"])))


# -- the plot ------------------------------------------------------------------------


def plot(report: dict[str, Any], path: str) -> None:
    """Steady time, compile (first-call for torch) time and compiled temporaries against the swept axis.

    One line per system; torch rows have no compiled program, so no memory line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = report.get("sweep") or "frames"
    index = 2 if axis == "frames" else 3
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4))
    measured = [r for r in report["results"] if not r.get("error")]  # a failed system has no figures
    for system in dict.fromkeys(r["system"] for r in measured):
        rows = [r for r in measured if r["system"] == system]
        xs = [r["shape"][index] for r in rows]
        a1.plot(xs, [r.get("steady_s") for r in rows], "o-", label=system)
        compile_key = "compile_s" if BY_NAME[system].compiles else "first_call_s"
        a2.plot(xs, [r.get(compile_key) for r in rows], "o-", label=system)
        temp = [(x, r["temp_bytes"] / 2**30) for x, r in zip(xs, rows, strict=True) if r.get("temp_bytes")]
        if temp:
            a3.plot(*zip(*temp, strict=True), "o-", label=system)
    xlabel = "latent frames" if axis == "frames" else "latent height = width"
    a1.set(xlabel=xlabel, ylabel="steady decode s (median)", title="decode time")
    a2.set(xlabel=xlabel, ylabel="s", title="compile (eager torch: first call)")
    a3.set(xlabel=xlabel, ylabel="GiB", title="compiled temporaries")
    for a in (a1, a2, a3):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.suptitle(f"{report['config']['model']}, {report['dtype']}, {report['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
