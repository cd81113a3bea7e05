"""The report's goodput section: the job's wall time as a timeline of ledger parts, each
interruption marked, and what each interruption cost (:mod:`rankguard.goodput`)."""

from __future__ import annotations

from rankguard.goodput import PARTS, Ledger, Part, ettr_text
from rankguard.report.svg import Event, Span, empty_chart, timeline
from rankguard.report.svgbase import esc
from rankguard.report.wallclock import fmt_clock

__all__ = ["GOODPUT_TITLE", "PART_COLOURS", "goodput_chart", "goodput_html"]

GOODPUT_TITLE = "Where the wall time went"
PART_COLOURS = {
    Part.PRODUCTIVE: "#2da44e",
    Part.STARTUP: "#54aeff",
    Part.RECOMPUTED: "#fb8f44",
    Part.CHECKPOINT_STALL: "#8250df",
    Part.EVALUATION: "#bf8700",
    Part.DETECTION_WAIT: "#cf222e",
    Part.RECOVERY: "#ff8182",
    Part.RERUN_VALIDATION: "#6e7781",
    Part.PREEMPTION_DRAIN: "#0969da",
    Part.UNKNOWN: "#afb8c1",
}
MAX_SPANS = 1500  # the longest spans drawn; a tooltip each
_INTERRUPTIONS = "interruptions"


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


def goodput_chart(ledger: Ledger) -> str:
    """One row per part that took time, its spans on it; the interruptions on top."""
    rows = [_INTERRUPTIONS] if ledger.interruptions else []
    shown = [p for p in PARTS if ledger.parts[p] > 0]
    rows += [p.value for p in shown]
    index = {p: rows.index(p.value) for p in shown}
    origin = ledger.start
    longest = sorted(ledger.spans, key=lambda s: s[1] - s[0], reverse=True)[:MAX_SPANS]
    spans = [
        Span(
            index[part],
            a - origin,
            b - origin,
            f"{part.value}: +{a - origin:.1f} s to +{b - origin:.1f} s ({_s(b - a)})",
            PART_COLOURS[part],
        )
        for a, b, part in longest
        if part in index
    ]
    events = [
        Event(
            0,
            i.at - origin,
            PART_COLOURS[Part.DETECTION_WAIT],
            "diamond",
            f"interruption {k}: {i.cause or 'cause unknown'}"
            + (f" at iteration {i.iteration}" if i.iteration is not None else " before a step")
            + f", cost {_s(i.cost_s)}",
        )
        for k, i in enumerate(ledger.interruptions, 1)
    ]
    if not spans:
        return empty_chart(GOODPUT_TITLE, "no wall time to place on a timeline")
    return timeline(
        GOODPUT_TITLE,
        rows,
        spans,
        events,
        x_label=f"seconds since {fmt_clock(origin)}",
        legend_items=[(p.value, PART_COLOURS[p], "band") for p in shown],
    )


def _parts_table(ledger: Ledger) -> str:
    wall = ledger.wall_s
    rows = "".join(
        f'<tr><td><span class="swatch" style="background:{PART_COLOURS[p]}"></span>'
        f'{esc(p.value)}</td><td class="num">{esc(_s(ledger.parts[p]))}</td>'
        f'<td class="num">{100 * ledger.parts[p] / wall:.1f} %</td></tr>'
        for p in PARTS
        if wall > 0
    )
    return (
        '<div class="table-wrap"><table><thead><tr><th>Part</th>'
        '<th class="num">Time</th><th class="num">Share of wall</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div>"
    )


def _interruptions_table(ledger: Ledger) -> str:
    if not ledger.interruptions:
        return '<p class="caption">No interruption: one attempt ran to its end.</p>'
    cols = (Part.RECOMPUTED, Part.DETECTION_WAIT, Part.RECOVERY, Part.STARTUP)
    head = "".join(f'<th class="num">{esc(p.value)}</th>' for p in cols)
    rows = []
    for k, i in enumerate(ledger.interruptions, 1):
        cells = "".join(f'<td class="num">{esc(_s(i.parts.get(p, 0.0)))}</td>' for p in cols)
        it = "-" if i.iteration is None else str(i.iteration)
        resumed = "-" if i.resumed_from is None else str(i.resumed_from)
        rows.append(
            f'<tr><td class="num">{k}</td><td>{esc(i.cause or "unknown")}</td>'
            f'<td class="num">+{i.at - ledger.start:.1f} s</td><td class="num">{esc(it)}</td>'
            f'<td class="num">{esc(resumed)}</td>{cells}'
            f'<td class="num">{esc(_s(i.cost_s))}</td></tr>'
        )
    return (
        "<h3>Interruptions</h3>"
        '<p class="caption">Each failure: its last completed step, the iteration the next '
        "attempt resumed after, and what it cost: steps done again, the wait until the "
        "launcher's decision, the recovery until the next start, and that start-up.</p>"
        '<div class="table-wrap"><table><thead><tr><th class="num">#</th>'
        '<th>Cause</th><th class="num">Last step at</th><th class="num">Iteration</th>'
        f'<th class="num">Resumed after</th>{head}<th class="num">Cost</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _figure(caption: str, svg: str) -> str:
    return (
        f'<figure class="chart"><figcaption><h3>{esc(GOODPUT_TITLE)}</h3>'
        f'<p>{esc(caption)}</p></figcaption><div class="scroll">{svg}</div></figure>'
    )


def goodput_html(ledger: Ledger | None) -> str:
    """The section's body: the ETTR, the timeline, the parts and the interruptions."""
    if ledger is None:
        return _figure(
            "The goodput ledger needs rank 0's heartbeat records.",
            empty_chart(GOODPUT_TITLE, "no heartbeat of rank 0: no goodput ledger"),
        )
    caption = (
        f"ETTR {ettr_text(ledger.ettr)}: productive training over "
        f"{_s(ledger.wall_s)} of wall time, "
        f"{ledger.attempts} attempt(s). Each row is a part of the goodput ledger (the "
        "parts sum to the wall time; rankguard goodput prints the same); markers: the "
        "last completed step before each interruption. Hover a bar for its times."
    )
    return (
        _figure(caption, goodput_chart(ledger))
        + _parts_table(ledger)
        + _interruptions_table(ledger)
    )
