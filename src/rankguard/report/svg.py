"""Dependency-free SVG charts for the report: line chart, heatmap, timeline strip.

Each function takes plain numbers and labels and returns one ``<svg>`` element as a
string, sized by its ``viewBox`` so it scales to the width of the page. They handle the
degenerate inputs a real run produces (no data yet, a single logged window, equal
values) without dividing by zero, and thin out long series so a week-long run still
gives a page of reasonable size. Hover tooltips use SVG ``<title>`` elements, so no
JavaScript is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankguard.report.svgbase import (
    AXIS,
    MUTED,
    Axes,
    Scale,
    esc,
    fmt_num,
    legend,
    marker,
    svg_close,
    svg_open,
    text_width,
)

__all__ = ["Band", "Event", "Series", "Span", "heat_colour", "heatmap", "line_chart", "timeline"]

WIDTH = 1080
_MARKER_LIMIT = 60  # draw a dot per point up to this many points
_MAX_POINTS = 1200
# Sequential yellow-orange-red (ColorBrewer YlOrRd): monotonic lightness, colour-blind safe.
_HEAT = ((255, 255, 204), (254, 217, 118), (253, 141, 60), (227, 26, 28), (128, 0, 38))


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    color: str
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Band:
    """A shaded range, e.g. the min..max over ranks: points are ``(x, low, high)``."""

    name: str
    points: Sequence[tuple[float, float, float]]
    color: str


@dataclass(frozen=True, slots=True)
class Span:
    """A bar on a timeline row from ``start`` to ``end`` (x units)."""

    row: int
    start: float
    end: float
    label: str
    color: str = "#c9d1d9"


@dataclass(frozen=True, slots=True)
class Event:
    """A marker on a timeline row at ``x``."""

    row: int
    x: float
    color: str
    shape: str
    label: str


def _finite(*values: float) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def decimate(points: Sequence[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    """At most about ``limit`` points, keeping each bucket's extremes (spikes stay visible)."""
    pts = [p for p in points if _finite(*p)]
    if len(pts) <= limit:
        return pts
    size = math.ceil(len(pts) / (limit // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(pts), size):
        bucket = pts[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


def empty_chart(title: str, message: str, width: float = WIDTH, height: float = 120) -> str:
    """A placeholder of the chart's size that says why there is nothing to draw."""
    return (
        svg_open(width, height, title, message)
        + f'<rect x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" rx="6" '
        f'fill="#f6f8fa" stroke="#d8dee4" stroke-dasharray="4 4"/>'
        f'<text x="{width / 2}" y="{height / 2}" dy="0.32em" text-anchor="middle" '
        f'fill="{MUTED}" font-size="13">{esc(message)}</text>' + svg_close()
    )


def _left_margin(scale: Scale, y_label: str) -> float:
    widest = max((text_width(fmt_num(t)) for t in scale.ticks()), default=20.0)
    return (26 if y_label else 6) + widest + 10


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    bands: Sequence[Band] = (),
    width: float = WIDTH,
    height: float = 280,
    zero: bool = True,
    x_fmt: str = "num",
    empty: str = "no data",
    events: Sequence[Event] = (),
    event_legend: Sequence[tuple[str, str, str]] = (),
) -> str:
    """Lines over a shared x axis, with optional shaded bands, vertical event marks
    (their ``row`` is ignored) and a legend on top."""
    lines = [(s, decimate(s.points, _MAX_POINTS)) for s in series]
    shaded = [(b, [p for p in b.points if _finite(*p)]) for b in bands]
    xs = [p[0] for _, pts in lines for p in pts] + [p[0] for _, pts in shaded for p in pts]
    events = [e for e in events if _finite(e.x)] if xs else []
    xs += [e.x for e in events]
    ys = [p[1] for _, pts in lines for p in pts]
    ys += [v for _, pts in shaded for p in pts for v in p[1:]]
    if not xs:
        return empty_chart(title, empty, width, min(height, 140))
    items = [(b.name, b.color, "band") for b, pts in shaded if pts]
    items += [(s.name, s.color, "dashed" if s.dashed else "line") for s, pts in lines if pts]
    if len(items) == 1:  # the chart's title already says what the one line is
        items = []
    items += list(event_legend) if events else []
    top = 40 if items else 14
    bottom = height - 48
    y_scale = Scale.fit(ys, bottom, top, zero=zero)
    left = _left_margin(y_scale, y_label)
    x_scale = Scale.fit(xs, left, width - 18, zero=False)
    axes = Axes(x_scale, y_scale)
    parts = [svg_open(width, height, title), axes.draw(x_label, y_label, x_fmt=x_fmt)]
    parts.append(legend(items, left, 14, width - 10))
    for band, bpts in shaded:
        if len(bpts) == 1:
            x, lo, hi = bpts[0]
            parts.append(
                f'<line x1="{x_scale(x)}" x2="{x_scale(x)}" y1="{y_scale(lo)}" '
                f'y2="{y_scale(hi)}" stroke="{band.color}" stroke-width="8"/>'
            )
        elif bpts:
            upper = " ".join(f"{x_scale(x)},{y_scale(hi)}" for x, _, hi in bpts)
            lower = " ".join(f"{x_scale(x)},{y_scale(lo)}" for x, lo, _ in reversed(bpts))
            parts.append(f'<polygon points="{upper} {lower}" fill="{band.color}"/>')
    for e in events:
        x = x_scale(e.x)
        parts.append(
            f'<g><line x1="{x}" x2="{x}" y1="{axes.top}" y2="{axes.bottom}" stroke="{e.color}" '
            f'stroke-width="1.5" stroke-dasharray="3 3"/>{marker(e.shape, x, axes.top, e.color)}'
            f"<title>{esc(e.label)}</title></g>"
        )
    for s, pts in lines:
        if len(pts) > 1:
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            coords = " ".join(f"{x_scale(x)},{y_scale(y)}" for x, y in pts)
            parts.append(
                f'<polyline points="{coords}" fill="none" stroke="{s.color}" stroke-width="2" '
                f'stroke-linejoin="round" stroke-linecap="round"{dash}/>'
            )
        if len(pts) <= _MARKER_LIMIT:
            for x, y in pts:
                tip = f"{s.name}: {fmt_num(y, 4)} at {x_label.split(' (')[0]} {fmt_num(x, 6)}"
                dot = marker("circle", x_scale(x), y_scale(y), s.color, 3.2)
                parts.append(f"<g>{dot}<title>{esc(tip)}</title></g>")
    parts.append(svg_close())
    return "".join(parts)


def heat_colour(t: float) -> str:
    """Colour of ``t`` in [0, 1] on the sequential scale (light = low, dark red = high)."""
    t = min(1.0, max(0.0, t if math.isfinite(t) else 0.0)) * (len(_HEAT) - 1)
    i = min(int(t), len(_HEAT) - 2)
    f = t - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(_HEAT[i], _HEAT[i + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(
    title: str,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    values: Sequence[Sequence[float | None]],
    *,
    x_label: str,
    y_label: str,
    unit: str,
    width: float = WIDTH,
    empty: str = "no data",
) -> str:
    """A matrix of coloured cells (rows x columns) with a colour legend underneath."""
    cells = [v for row in values for v in row if v is not None and math.isfinite(v)]
    if not row_labels or not col_labels or not cells:
        return empty_chart(title, empty, width)
    vmin, vmax = min(cells), max(cells)
    n_rows, n_cols = len(row_labels), len(col_labels)
    cell_h = min(26.0, max(12.0, 320 / n_rows))
    left = 26 + max(text_width(r) for r in row_labels) + 10
    top, plot_w = 12.0, width - left - 18
    cell_w = plot_w / n_cols
    bottom = top + cell_h * n_rows
    height = bottom + 96
    parts = [svg_open(width, height, title)]
    for i, label in enumerate(row_labels):
        y = top + i * cell_h
        parts.append(
            f'<text x="{left - 8}" y="{y + cell_h / 2}" dy="0.32em" text-anchor="end" '
            f'fill="{MUTED}">{esc(label)}</text>'
        )
        for j, v in enumerate(values[i][:n_cols] if i < len(values) else []):
            if v is not None and math.isfinite(v):
                fill = heat_colour((v - vmin) / (vmax - vmin) if vmax > vmin else 0.0)
                tip = f"{label}, {col_labels[j]}: {fmt_num(v, 4)} {unit}"
            else:
                fill, tip = "#eef1f4", f"{label}, {col_labels[j]}: no value"
            parts.append(
                f'<rect x="{left + j * cell_w:.2f}" y="{y:.2f}" width="{cell_w:.2f}" '
                f'height="{cell_h:.2f}" fill="{fill}" stroke="#ffffff" stroke-width="1">'
                f"<title>{esc(tip)}</title></rect>"
            )
    every = max(1, math.ceil(n_cols / max(1, int(plot_w // 70))))
    for j in range(0, n_cols, every):
        x = left + (j + 0.5) * cell_w
        parts.append(
            f'<text x="{x:.2f}" y="{bottom + 16}" text-anchor="middle" fill="{MUTED}">'
            f"{esc(col_labels[j])}</text>"
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{bottom + 36}" text-anchor="middle" fill="{MUTED}" '
        f'font-weight="600">{esc(x_label)}</text>'
        f'<text transform="translate(14 {(top + bottom) / 2}) rotate(-90)" '
        f'text-anchor="middle" fill="{MUTED}" font-weight="600">{esc(y_label)}</text>'
    )
    parts.append(_colour_legend(left, bottom + 56, vmin, vmax, unit))
    parts.append(svg_close())
    return "".join(parts)


def _colour_legend(x: float, y: float, vmin: float, vmax: float, unit: str) -> str:
    steps, w = 48, 5.0
    parts = [
        f'<rect x="{x + i * w:.1f}" y="{y}" width="{w + 0.4:.1f}" height="10" '
        f'fill="{heat_colour(i / (steps - 1))}"/>'
        for i in range(steps)
    ]
    end = x + steps * w
    parts.append(
        f'<rect x="{x}" y="{y}" width="{steps * w}" height="10" fill="none" stroke="{AXIS}" '
        f'stroke-width="0.5"/>'
        f'<text x="{x}" y="{y + 24}" fill="{MUTED}">{esc(fmt_num(vmin, 4))}</text>'
        f'<text x="{end}" y="{y + 24}" text-anchor="end" fill="{MUTED}">'
        f"{esc(fmt_num(vmax, 4))}</text>"
        f'<text x="{end + 12}" y="{y + 5}" dy="0.32em" fill="{MUTED}">{esc(unit)} '
        "(light: fast, dark: slow)</text>"
    )
    return "".join(parts)


def timeline(
    title: str,
    rows: Sequence[str],
    spans: Sequence[Span],
    events: Sequence[Event],
    *,
    x_label: str,
    legend_items: Sequence[tuple[str, str, str]] = (),
    width: float = WIDTH,
    empty: str = "no data",
) -> str:
    """Rows of bars (e.g. process lifetimes) with event markers, time on x."""
    spans = [s for s in spans if _finite(s.start, s.end) and 0 <= s.row < len(rows)]
    events = [e for e in events if _finite(e.x) and 0 <= e.row < len(rows)]
    xs = [v for s in spans for v in (s.start, s.end)] + [e.x for e in events]
    if not rows or not xs:
        return empty_chart(title, empty, width)
    row_h = min(28.0, max(16.0, 300 / len(rows)))
    top = 40.0 if legend_items else 14.0
    bottom = top + row_h * len(rows)
    left = 26 + max(text_width(r) for r in rows) + 10
    x_scale = Scale.fit(xs, left, width - 18, zero=True)
    axes = Axes(x_scale, Scale(0, 1, bottom, top))
    parts = [svg_open(width, bottom + 48, title), legend(legend_items, left, 14, width - 10)]
    for i, label in enumerate(rows):
        y = top + i * row_h
        if i % 2 == 0:
            parts.append(
                f'<rect x="{left}" y="{y:.2f}" width="{width - 18 - left}" height="{row_h:.2f}" '
                f'fill="#f6f8fa"/>'
            )
        parts.append(
            f'<text x="{left - 8}" y="{y + row_h / 2:.2f}" dy="0.32em" text-anchor="end" '
            f'fill="{MUTED}">{esc(label)}</text>'
        )
    parts.append(axes.draw(x_label, "", y_ticks=False, x_fmt="seconds"))
    bar_h = min(10.0, row_h * 0.45)
    for s in spans:
        y = top + (s.row + 0.5) * row_h - bar_h / 2
        x0, x1 = x_scale(s.start), x_scale(s.end)
        parts.append(
            f'<rect x="{x0}" y="{y:.2f}" width="{max(2.0, x1 - x0):.2f}" height="{bar_h:.2f}" '
            f'rx="{bar_h / 2:.2f}" fill="{s.color}"><title>{esc(s.label)}</title></rect>'
        )
    for e in events:
        y = top + (e.row + 0.5) * row_h
        mark = marker(e.shape, x_scale(e.x), y, e.color, 5.5)
        parts.append(f"<g>{mark}<title>{esc(e.label)}</title></g>")
    parts.append(svg_close())
    return "".join(parts)
