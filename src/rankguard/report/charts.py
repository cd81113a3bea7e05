"""The report's charts, built from a run's files.

Rank 0's ``perf.jsonl`` gives the time series (one point per logged window: step time,
TFLOP/s, throughput, memory). Node 0's ``perf_ranks.jsonl`` gives the same windows for
every rank, drawn as a min..max band with the median and as the rank x window heatmap,
where a slow or waiting rank stands out. Findings and the heartbeat streams give the
timeline. Large jobs are aggregated (groups of ranks, bins of windows, max of each) so
the page stays readable and a slow rank is never averaged away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rankguard.report.data import RunData, parse_time
from rankguard.report.summary import fmt_clock, run_window
from rankguard.report.svg import Band, Event, Series, Span, heatmap, line_chart, timeline
from rankguard.schema.coerce import as_dict, as_finite
from rankguard.schema.findings import FindingType
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "FINDING_STYLE",
    "HEATMAP_MAX_COLS",
    "HEATMAP_MAX_ROWS",
    "finding_style",
    "findings_timeline",
    "memory_chart",
    "rank_heatmap",
    "samples_chart",
    "step_time_chart",
    "tflops_chart",
    "tokens_chart",
]

BLUE, BAND, GREY, ORANGE, GREEN, PURPLE = (
    "#0969da",
    "#cfe3fb",
    "#6e7781",
    "#c2580c",
    "#1a7f37",
    "#8250df",
)
HEATMAP_MAX_ROWS = 32
HEATMAP_MAX_COLS = 120
TIMELINE_MAX_ROWS = 40
MAX_MARKS = 40
DASH = "\u2013"

# Okabe-Ito colours (distinguishable with colour-vision deficiencies), plus a shape each.
FINDING_STYLE: dict[str, tuple[str, str, str]] = {
    t.value: (colour, shape, t.info.title)
    for t, (colour, shape) in {
        FindingType.PROCESS_TIMEOUT: ("#d55e00", "diamond"),
        FindingType.PROGRESS_TIMEOUT: ("#e69f00", "circle"),
        FindingType.PROCESS_EXITED: ("#cc79a7", "square"),
        FindingType.HEALTH_FAILURE: ("#0072b2", "triangle"),
        FindingType.HEALTH_WARNING: ("#56b4e9", "triangle"),
        FindingType.SECTION_TIMEOUT: ("#009e73", "diamond"),
        FindingType.STRAGGLER: ("#000000", "square"),
        FindingType.NODE_DISK_FULL: ("#f0e442", "square"),
        FindingType.RERUN_TRANSIENT_FAULT: ("#56b4e9", "circle"),
        FindingType.RERUN_PERSISTENT_FAULT: ("#e69f00", "triangle"),
        FindingType.RERUN_VALIDATION_FAILED: ("#d55e00", "triangle"),
        FindingType.RERUN_REPRODUCIBLE_FAULT: ("#cc79a7", "diamond"),
        FindingType.PREEMPTED: ("#6e7781", "circle"),
        FindingType.INPROCESS_RESTART: ("#56b4e9", "circle"),
        FindingType.WORKER_FAILED: ("#cc79a7", "circle"),
        FindingType.NODE_EXCLUDED: ("#0072b2", "square"),
        FindingType.NODE_HEALTH_FAILURE: ("#009e73", "square"),
        FindingType.UNINTERRUPTIBLE: ("#d55e00", "circle"),
    }.items()
}


def finding_style(finding_type: str) -> tuple[str, str, str]:
    """``(colour, marker shape, short label)`` of a finding type."""
    return FINDING_STYLE.get(finding_type, (GREY, "circle", finding_type or "finding"))


def _x(entry: JsonObject) -> float | None:
    """The x of a logged window: its iteration, else its step number."""
    it = as_finite(entry.get("iteration"))
    return it if it is not None else as_finite(entry.get("step"))


def _points(entries: Sequence[JsonObject], *keys: str) -> list[tuple[float, float]]:
    """``(iteration, value)`` of the first of ``keys`` present in each entry."""
    out = []
    for e in entries:
        x = _x(e)
        y = next((v for v in (as_finite(e.get(k)) for k in keys) if v is not None), None)
        if x is not None and y is not None:
            out.append((x, y))
    return out


def step_time_chart(data: RunData) -> str:
    band, median = [], []
    for line in data.perf_ranks:
        x, st = _x(line), line.get("step_time_ms")
        if x is None or not isinstance(st, dict):
            continue
        lo, mid, hi = (
            as_finite(st.get("min")),
            as_finite(st.get("median")),
            as_finite(st.get("max")),
        )
        if lo is not None and hi is not None:
            band.append((x, lo, hi))
        if mid is not None:
            median.append((x, mid))
    series = [
        Series("median over ranks", median, GREY, dashed=True),
        Series(
            "rank 0 (perf.jsonl)",
            # the first window of a loop without a phase runs from start-up: not a step
            _points(
                [e for e in data.perf_entries if not e.get("includes_startup")],
                "gpu_step_time_ms",
                "step_time_ms",
            ),
            BLUE,
        ),
    ]
    marks, legend_items = _finding_marks(data)
    return line_chart(
        "Step time per iteration",
        series,
        events=marks,
        event_legend=legend_items,
        bands=[Band(f"min{DASH}max over ranks", band, BAND)],
        x_label="iteration",
        y_label="step time (ms)",
        empty="no step times: perf.jsonl and perf_ranks.jsonl are missing or empty",
    )


def _finding_marks(data: RunData) -> tuple[list[Event], list[tuple[str, str, str]]]:
    """Findings at the iteration the rank was at, one mark per (iteration, type)."""
    marks: dict[tuple[float, str], list[str]] = {}
    for f in data.findings:
        it = as_finite(f.iteration)
        if it is not None:
            who = str(f.rank) if f.rank >= 0 else "None"
            marks.setdefault((it, f.finding_type.value), []).append(who)
    events, legend_items = [], {}
    for (it, ftype), ranks in sorted(marks.items())[:MAX_MARKS]:
        colour, shape, short = finding_style(ftype)
        who = ", ".join(ranks[:8]) + (" ..." if len(ranks) > 8 else "")
        events.append(Event(0, it, colour, shape, f"{short} at iteration {it:g}: rank {who}"))
        legend_items[ftype] = (short, colour, shape)
    return events, [legend_items[k] for k in sorted(legend_items)]


def _perf_chart(
    data: RunData, key: str, title: str, series: str, y_label: str, colour: str, empty: str
) -> str:
    """One perf.jsonl column over iterations, in the report's half-width chart size."""
    points = _points(data.perf_entries, key)
    return line_chart(
        title,
        [Series(series, points, colour)],
        x_label="iteration",
        y_label=y_label,
        width=540,
        height=260,
        empty=empty,
    )


def tflops_chart(data: RunData) -> str:
    return _perf_chart(
        data,
        "TFLOPS_per_GPU",
        "TFLOP/s per GPU",
        "achieved TFLOP/s per GPU",
        "TFLOP/s per GPU",
        GREEN,
        "no TFLOP/s: FLOPs per step unknown or no perf.jsonl",
    )


def tokens_chart(data: RunData) -> str:
    return _perf_chart(
        data,
        "tokens_per_sec",
        "Throughput: tokens/s",
        "tokens/s, all ranks",
        "tokens/s",
        PURPLE,
        "no tokens/s: batch size not given or no perf.jsonl",
    )


def samples_chart(data: RunData) -> str:
    return _perf_chart(
        data,
        "samples_per_sec",
        "Throughput: samples/s",
        "samples/s, all ranks",
        "samples/s",
        PURPLE,
        "no samples/s: batch size not given or no perf.jsonl",
    )


def memory_chart(data: RunData) -> str:
    kind = next((e.get("memory_kind") for e in reversed(data.perf_entries)), None)
    what = "CPU RSS" if kind == "cpu_rss" else "allocated"
    return line_chart(
        "Memory, rank 0",
        [
            Series(f"{what} now", _points(data.perf_entries, "memory_GB"), BLUE),
            Series(
                f"{what} peak", _points(data.perf_entries, "peak_memory_GB"), ORANGE, dashed=True
            ),
        ],
        x_label="iteration",
        y_label="memory (GB)",
        width=540,
        height=260,
        empty="no memory readings: perf.jsonl is missing or empty",
    )


def _group(n: int, limit: int) -> int:
    return max(1, math.ceil(n / limit))


def _chunks(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _max(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def rank_heatmap(data: RunData) -> tuple[str, str]:
    """The rank x window step-time heatmap and a caption saying how it was aggregated."""
    lines = [ln for ln in data.perf_ranks if isinstance(ln.get("by_rank"), dict)]
    lines.sort(key=lambda ln: as_finite(ln.get("step")) or 0)
    by_rank = [as_dict(ln.get("by_rank")) or {} for ln in lines]
    ranks = sorted({int(r) for b in by_rank for r in b if str(r).isdigit()})
    grid = [[as_finite(b.get(str(r))) for b in by_rank] for r in ranks]
    cols = [
        str(ln.get("iteration") if ln.get("iteration") is not None else ln.get("step"))
        for ln in lines
    ]
    rg, cg = _group(len(ranks), HEATMAP_MAX_ROWS), _group(len(cols), HEATMAP_MAX_COLS)
    rows = [str(r) for r in ranks]
    if rg > 1:
        groups = _chunks(len(ranks), rg)
        rows = [f"{ranks[g[0]]}{DASH}{ranks[g[-1]]}" for g in groups]
        grid = [[_max([grid[i][j] for i in g]) for j in range(len(cols))] for g in groups]
    if cg > 1:
        bins = _chunks(len(cols), cg)
        cols = [cols[b[0]] for b in bins]
        grid = [[_max([row[j] for j in b]) for b in bins] for row in grid]
    notes = []
    if rg > 1:
        notes.append(f"rows are groups of {rg} ranks")
    if cg > 1:
        notes.append(f"columns are bins of {cg} logged windows")
    caption = "Each cell is one rank's mean step time over a logged window."
    if notes:
        caption += f" {' and '.join(notes).capitalize()}, showing the slowest value."
    svg = heatmap(
        "Step time per rank and window",
        rows,
        cols,
        grid,
        x_label="iteration (end of logged window)",
        y_label="rank" if rg == 1 else "ranks",
        unit="ms",
        empty="no per-rank step times: perf_ranks.jsonl is missing or empty",
    )
    return svg, caption


def findings_timeline(data: RunData) -> tuple[str, str]:
    """Process lifetimes and findings over wall time, one row per rank, and a caption."""
    t0, _ = run_window(data)
    origin = t0 or 0.0
    flagged = {f.rank for f in data.findings if f.rank >= 0}
    known = {p.rank for p in data.processes} | {
        r.rank for r in data.doc.ranks if r.rank is not None
    }
    ranks = sorted(known | flagged)
    caption = (
        "Bars: each rank process from its first to its last heartbeat record. Markers: findings."
    )
    if len(ranks) > TIMELINE_MAX_ROWS:
        shown = sorted(flagged)[:TIMELINE_MAX_ROWS]
        caption += f" Showing the {len(shown)} of {len(ranks)} ranks with findings."
        ranks = shown
    labels = [f"rank {r}" for r in ranks]
    if any(f.rank < 0 for f in data.findings):  # about the job or a node, no one rank
        labels.append("no rank")
    index = {r: i for i, r in enumerate(ranks)}
    spans = [
        Span(
            index[p.rank],
            p.start - origin,
            p.end - origin,
            _span_label(p.rank, p.pid, p.start, p.end, p.exit),
        )
        for p in data.processes
        if p.rank in index and p.start is not None and p.end is not None
    ]
    events: list[Event] = []
    seen: dict[str, tuple[str, str, str]] = {}
    for f in data.findings:
        t = parse_time(f.detected_wall_time)
        row = index.get(f.rank, -1) if f.rank >= 0 else len(ranks)
        if t is None or row < 0:
            continue
        ftype = f.finding_type.value
        colour, shape, short = finding_style(ftype)
        seen[ftype] = (short, colour, shape)
        events.append(
            Event(
                row,
                t - origin,
                colour,
                shape,
                f"+{t - origin:.1f} s {short}: {f.message}",
            )
        )
    svg = timeline(
        "Findings over time",
        labels,
        spans,
        events,
        x_label=f"seconds since {fmt_clock(t0)}" if t0 else "seconds",
        legend_items=[seen[k] for k in sorted(seen)],
        empty="no heartbeat records or findings to place on a timeline",
    )
    return svg, caption


def _span_label(
    rank: int, pid: int | None, start: float, end: float, exit_: JsonObject | None
) -> str:
    how = "still running or no process_end record"
    if exit_ is not None:
        how = (
            "exited cleanly" if exit_.get("clean") else f"exited with code {exit_.get('exit_code')}"
        )
    return f"rank {rank} pid {pid}: {fmt_clock(start)} to {fmt_clock(end)}, {how}"
