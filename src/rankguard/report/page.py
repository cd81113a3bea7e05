"""Assemble the run report: one self-contained HTML page.

Everything the page needs is inside it: the stylesheet, the charts as inline SVG, no
scripts, fonts, images or links to other hosts. It can be mailed, attached to a ticket
or opened from a cluster's shared filesystem years later and looks the same. Sections,
top to bottom, follow the questions asked after a run: what was it and how did it end
(header), how fast was it (key numbers, performance charts), which rank was slow or
stuck (heatmap, status table), what did the monitor find and when (timeline, findings
table), where the wall time went (the goodput ledger's timeline and interruptions), and
was the hardware sick (GPU health).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rankguard import __version__
from rankguard.report import charts, tables
from rankguard.report.data import RunData, parse_time
from rankguard.report.goodput import GOODPUT_TITLE, goodput_html
from rankguard.report.style import CSS
from rankguard.report.summary import fmt_clock, header_html, key_numbers_html, notices_html
from rankguard.report.svgbase import esc

__all__ = ["CHART_TITLES", "render_page"]

#: Titles of the charts on every page (an empty chart still has its frame and title).
CHART_TITLES = (
    "Step time per iteration",
    "TFLOP/s per GPU",
    "Throughput: tokens/s",
    "Throughput: samples/s",
    "Memory, rank 0",
    "Step time per rank and window",
    "Findings over time",
    GOODPUT_TITLE,
)


def _figure(title: str, caption: str, svg: str) -> str:
    return (
        f'<figure class="chart"><figcaption><h3>{esc(title)}</h3>'
        f'<p>{esc(caption)}</p></figcaption><div class="scroll">{svg}</div></figure>'
    )


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section class="block" id="{anchor}"><h2>{esc(title)}</h2>{body}</section>'


def _performance(data: RunData) -> str:
    info = (data.perf_summary or {}).get("session_info") or {}
    interval = info.get("log_interval") if isinstance(info, dict) else None
    every = f"every {interval} iterations" if interval else "at each logged window"
    step = _figure(
        CHART_TITLES[0],
        f"Mean time per step over each logged window ({every}). Line: rank 0. "
        "Shaded: fastest to slowest rank; dashed: median over ranks; vertical marks: "
        "findings, at the iteration the rank had reached.",
        charts.step_time_chart(data),
    )
    small = [
        (CHART_TITLES[1], "Achieved model FLOPs per second on each GPU.", charts.tflops_chart),
        (
            CHART_TITLES[2],
            "Global tokens per second, all data-parallel ranks.",
            charts.tokens_chart,
        ),
        (
            CHART_TITLES[3],
            "Global samples per second, all data-parallel ranks.",
            charts.samples_chart,
        ),
        (CHART_TITLES[4], "Memory in use now and the peak so far, rank 0.", charts.memory_chart),
    ]
    grid = "".join(_figure(t, c, build(data)) for t, c, build in small)
    return _section("performance", "Performance", step + f'<div class="grid">{grid}</div>')


def _ranks(data: RunData) -> str:
    svg, caption = charts.rank_heatmap(data)
    heat = _figure(CHART_TITLES[5], caption + " Hover a cell for its value.", svg)
    table = "<h3>Rank status</h3>" + _status_caption(data) + tables.rank_table(data)
    return _section("ranks", "Ranks", heat + table + tables.checkpoint_table(data))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _status_caption(data: RunData) -> str:
    status = data.status or {}
    when = parse_time(status.get("updated_wall_time"))
    text = f"From status.json, written {fmt_clock(when)}." if when else "From status.json."
    summary = _dict(status.get("summary"))
    counts = []
    for key in ("process_liveness", "gpu_progress"):
        part = _dict(summary.get(key))
        counts += [f"{n} {state}" for state, n in sorted(part.items()) if isinstance(n, int)]
    if counts:
        text += " Ranks: " + ", ".join(counts) + "."
    text += " Liveness: is the process alive; progress: are its steps completing."
    return f'<p class="caption">{esc(text)}</p>'


def _findings(data: RunData) -> str:
    svg, caption = charts.findings_timeline(data)
    body = _figure(CHART_TITLES[6], caption, svg) + tables.findings_table(data)
    body += tables.restarts_table(data)
    return _section("findings", f"Findings ({len(data.findings)})", body)


def _goodput(data: RunData) -> str:
    return _section("goodput", "Goodput", goodput_html(data.goodput))


def _gpu(data: RunData) -> str:
    return _section("gpu", "GPU health", tables.gpu_health_html(data))


def _footer(data: RunData, generated: datetime) -> str:
    sources = [str(p) for p in (data.heartbeat_dir, data.perf_dir) if p is not None]
    where = " and ".join(f"<code>{esc(s)}</code>" for s in sources) or "no directory"
    stamp = fmt_clock(generated.timestamp())
    return (
        f"<footer>Generated by rankguard {esc(__version__)} at {esc(stamp)} from {where}.</footer>"
    )


def render_page(
    data: RunData, *, note: str | None = None, generated: datetime | None = None
) -> str:
    """The complete HTML document for ``data``; ``note`` is shown above the numbers."""
    generated = generated or datetime.now(timezone.utc)
    nav = "".join(
        f'<a href="#{a}">{esc(t)}</a>'
        for a, t in (
            ("performance", "Performance"),
            ("ranks", "Ranks"),
            ("findings", "Findings"),
            ("goodput", "Goodput"),
            ("gpu", "GPU health"),
        )
    )
    body = (
        header_html(data)
        + f'<nav class="toc" aria-label="Sections">{nav}</nav>'
        + notices_html(data, note)
        + key_numbers_html(data)
        + _performance(data)
        + _ranks(data)
        + _findings(data)
        + _goodput(data)
        + _gpu(data)
        + _footer(data, generated)
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light">'
        f"<title>rankguard report · {esc(data.run_id)}</title>"
        f"<style>{CSS}</style></head>"
        f'<body><main class="wrap">{body}</main></body></html>\n'
    )
