"""The top of the report: what the run was (header) and how fast it went (key numbers).

Each value has a preferred source and fallbacks, because any file may be missing: the
perf summary is authoritative for averages (it leaves out warm-up), ``perf.jsonl`` is
used when the run did not finish, and the heartbeat side (``status.json``,
``perf_ranks.jsonl``, launcher records) fills in what the perf monitor did not write.
A value that no file provides is shown as a dash, never guessed.
"""

from __future__ import annotations

import statistics

from rankguard.report.data import RunData, parse_time
from rankguard.report.svgbase import esc, fmt_num
from rankguard.report.wallclock import fmt_clock
from rankguard.schema.coerce import as_dict, as_float
from rankguard.schema.jsontypes import JsonObject
from rankguard.view.statusnotes import restarts_summary

__all__ = [
    "fmt_clock",
    "fmt_duration",
    "header_html",
    "key_numbers_html",
    "notices_html",
    "run_window",
    "world_size",
]

DASH = "\u2014"
_STATE_CLASS = {
    "completed": "ok",
    "running": "info",
    "starting": "muted",
    "degraded": "warn",
    "stopped": "warn",
    "failed": "bad",
}


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def run_window(data: RunData) -> tuple[float | None, float | None]:
    """Earliest and latest wall time (epoch s) any file of the run records."""
    info = as_dict((data.perf_summary or {}).get("session_info")) or {}
    starts: list[float | None] = [p.start for p in data.processes]
    ends: list[float | None] = [p.end for p in data.processes]
    starts.append(parse_time(info.get("start_time")))
    ends.append(parse_time(info.get("end_time")))
    ends.append(parse_time(data.doc.updated_wall_time))
    both = [parse_time(e.get("timestamp")) for e in data.perf_entries]
    both += [parse_time(f.detected_wall_time) for f in data.findings]
    lo = [t for t in starts + both if t is not None]
    hi = [t for t in ends + both if t is not None]
    return (min(lo) if lo else None, max(hi) if hi else None)


def world_size(data: RunData) -> int | None:
    doc = data.doc
    candidates = [
        doc.monitor.expected_world_size,
        doc.summary.ranks_expected,
        (as_dict((data.perf_summary or {}).get("session_info")) or {}).get("world_size"),
        *(line.get("world_size") for line in data.perf_ranks[-1:]),
    ]
    for launcher in data.launchers.values():
        nnodes = launcher.get("nnodes")
        nproc = launcher.get("nproc_per_node")
        if isinstance(nproc, int) and isinstance(nnodes, list) and nnodes:
            last = nnodes[-1]
            if isinstance(last, int | float | str):
                candidates.append(nproc * int(last))
    return next((int(c) for c in candidates if isinstance(c, int) and c > 0), None)


def _findings_counts(data: RunData) -> tuple[int, int | None]:
    summary = data.doc.summary
    total = summary.findings_total
    total = max(total, len(data.findings)) if total is not None else len(data.findings)
    return total, summary.findings_active


def header_html(data: RunData) -> str:
    info = as_dict((data.perf_summary or {}).get("session_info")) or {}
    state = data.doc.state or "unknown"
    t0, t1 = run_window(data)
    total, active = _findings_counts(data)
    device = str(info.get("device") or DASH)
    if info.get("dtype"):
        device += f" · {info['dtype']}"
    peak = as_float(info.get("peak_tflops_per_gpu"))
    peak_src = str(info.get("peak_source") or DASH)
    if peak is not None:
        peak_src = f"{fmt_num(peak, 4)} TFLOP/s per GPU ({peak_src})"
    findings = f"{total}" + (f" ({active} active)" if active else "")
    restarts = restarts_summary(data.restarts)
    if restarts:
        findings += f" · {restarts}"
    ws = world_size(data)
    hosts = sorted({r.hostname for r in data.doc.ranks if r.hostname})
    where = f"on {hosts[0]}" if len(hosts) == 1 else f"on {len(hosts)} hosts" if hosts else ""
    span = _span(t0, t1)
    meta = [
        ("State", f'<span class="badge {_STATE_CLASS.get(state, "muted")}">{esc(state)}</span>'),
        ("World size", esc(ws if ws is not None else DASH) + _sub(where)),
        ("Duration", esc(fmt_duration(t1 - t0 if t0 and t1 else None)) + _sub(span)),
        ("Device", esc(device)),
        ("FLOPs source", esc(info.get("flops_source") or DASH)),
        ("Batch source", esc(info.get("batch_source") or DASH)),
        ("Peak source", esc(peak_src)),
        (
            "Findings",
            f'<span class="{"bad-text" if total or restarts else ""}">{esc(findings)}</span>',
        ),
        ("Iterations", esc(_iterations(data) or DASH)),
    ]
    cells = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in meta)
    return (
        '<header class="top"><p class="eyebrow">rankguard run report</p>'
        f'<h1>{esc(data.run_id)}</h1><dl class="meta">{cells}</dl></header>'
    )


def _iterations(data: RunData) -> int | None:
    """The last iteration any file reports."""
    seen: list[object] = [r.iteration for r in data.doc.ranks]
    seen += [e.get("iteration") for e in data.perf_entries[-1:]]
    seen.append(
        (as_dict((data.perf_summary or {}).get("session_info")) or {}).get("total_iterations")
    )
    known = [int(v) for v in seen if isinstance(v, int)]
    return max(known) if known else None


def _span(t0: float | None, t1: float | None) -> str:
    """``2026-11-29 11:23:45 to 11:24:01 UTC`` (en dash), the date twice only if it changes."""
    if t0 is None or t1 is None:
        return ""
    a, b = fmt_clock(t0), fmt_clock(t1)
    if "-" in (a, b):
        return ""
    return f"{a[:-4]}\u2013{b[11:] if a[:10] == b[:10] else b}"


def _sub(text: str) -> str:
    return f'<span class="sub">{esc(text)}</span>' if text else ""


def _from_entries(data: RunData) -> dict[str, float | None]:
    """Averages over perf.jsonl windows after the first (warm-up), for unfinished runs."""
    rows = data.perf_entries[1:] or data.perf_entries

    def mean(key: str) -> float | None:
        vals = [v for v in (as_float(e.get(key)) for e in rows) if v is not None]
        return statistics.fmean(vals) if vals else None

    peaks = [v for v in (as_float(e.get("peak_memory_GB")) for e in data.perf_entries) if v]
    steps = [as_float(e.get("gpu_step_time_ms")) or as_float(e.get("step_time_ms")) for e in rows]
    known = [s for s in steps if s is not None]
    return {
        "avg_step_time_ms": statistics.fmean(known) if known else None,
        "median_step_time_ms": statistics.median(known) if known else None,
        "avg_tokens_per_sec": mean("tokens_per_sec"),
        "avg_samples_per_sec": mean("samples_per_sec"),
        "avg_tflops_per_gpu": mean("TFLOPS_per_GPU"),
        "avg_mfu": mean("MFU"),
        "peak_memory_gb": max(peaks) if peaks else None,
    }


def _card_num(value: float | None) -> str:
    """``4,741``, ``216``, ``0.0017``, ``1.23M``; an em dash when unknown."""
    if value is None:
        return DASH
    if abs(value) >= 1e6:
        return fmt_num(value, 3)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return fmt_num(value, 3)


def key_numbers_html(data: RunData) -> str:
    summary = as_dict(data.perf_summary) or {}
    stats: JsonObject = (as_dict(summary.get("final_statistics")) or {}) or {**_from_entries(data)}
    info = as_dict(summary.get("session_info")) or {}
    source = "perf summary" if summary.get("final_statistics") else "perf.jsonl windows"
    if not data.has_perf and data.perf_ranks:
        medians = [
            as_float((as_dict(x.get("step_time_ms")) or {}).get("median")) for x in data.perf_ranks
        ]
        known = [m for m in medians if m is not None]
        stats = {"avg_step_time_ms": statistics.fmean(known) if known else None}
        source = "perf_ranks.jsonl (median over ranks)"
    kind = next((e.get("memory_kind") for e in reversed(data.perf_entries)), None)
    warm = info.get("warmup_iterations")
    median = as_float(stats.get("median_step_time_ms"))
    step_note = f"median {fmt_num(median, 4)} ms" if median is not None else source
    if isinstance(warm, int) and warm:
        step_note += f" · first {warm} steps left out"
    samples = as_float(stats.get("avg_samples_per_sec"))
    mfu = as_float(stats.get("avg_mfu"))
    cards = [
        ("Avg step time", as_float(stats.get("avg_step_time_ms")), "ms", step_note),
        (
            "Tokens/s",
            as_float(stats.get("avg_tokens_per_sec")),
            "",
            f"{fmt_num(samples, 4)} samples/s, all ranks" if samples else "all ranks",
        ),
        (
            "TFLOP/s per GPU",
            as_float(stats.get("avg_tflops_per_gpu")),
            "",
            str(info.get("flops_source") or "FLOPs per step unknown"),
        ),
        (
            "MFU",
            None if mfu is None else 100 * mfu,
            "%",
            "of peak" if mfu is not None else "peak TFLOP/s unknown",
        ),
        (
            "Peak memory",
            as_float(stats.get("peak_memory_gb")),
            "GB",
            {
                "cpu_rss": "CPU resident set (no GPU)",
                "cuda_allocated": "CUDA allocated, rank 0",
            }.get(str(kind), "rank 0"),
        ),
    ]
    html = []
    for label, value, unit, note in cards:
        shown = _card_num(value)
        unit_html = f'<span class="unit">{esc(unit)}</span>' if value is not None and unit else ""
        html.append(
            f'<div class="card"><div class="label">{esc(label)}</div>'
            f'<div class="value">{esc(shown)}{unit_html}</div>'
            f'<div class="note">{esc(note)}</div></div>'
        )
    return f'<section class="cards" aria-label="Key numbers">{"".join(html)}</section>'


def notices_html(data: RunData, note: str | None = None) -> str:
    """What is missing or malformed, so an empty chart is never a mystery."""
    items = [("info", note[:1].upper() + note[1:])] if note else []
    items += [("warn", m) for m in data.missing] + [("bad", p) for p in data.problems]
    if not items:
        return ""
    lis = "".join(f'<li class="{k}">{esc(text)}</li>' for k, text in items)
    return f'<section class="notices" aria-label="Data notes"><ul>{lis}</ul></section>'
