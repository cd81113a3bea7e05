"""Primitives for the report's SVG charts: escaping, number formatting, ticks, scales, axes.

Kept free of any plotting library so the report works wherever rankguard is installed
and the page stays one self-contained file. Every function returns SVG markup as a
string; all text goes through :func:`esc`, so values read from run files cannot inject
markup. The output is well-formed XML (the unit tests parse it).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "AXIS",
    "FONT",
    "GRID",
    "MUTED",
    "TEXT",
    "Axes",
    "Scale",
    "esc",
    "fmt_num",
    "legend",
    "marker",
    "nice_ticks",
    "svg_close",
    "svg_open",
    "tick_labels",
]

FONT = (
    "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', "
    "'Liberation Sans', Arial, sans-serif"
)
TEXT = "#1f2328"
MUTED = "#59636e"
AXIS = "#8c959f"
GRID = "#e6e9ed"
_SUFFIXES = ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"))
_CHAR_W = 6.6  # average glyph width at 11.5 px, for layout estimates


def esc(value: object) -> str:
    """Text safe in HTML and XML content and attribute values."""
    return html.escape(str(value), quote=True)


def fmt_num(value: float | None, digits: int = 3) -> str:
    """Short human form: ``1234``, ``12.3k``, ``1.5M``, ``0.0042``, ``-`` for ``None``/NaN."""
    if value is None or not math.isfinite(value):
        return "-"
    a = abs(value)
    if a >= 1e4:
        for div, suffix in _SUFFIXES:
            scaled = value / div
            if abs(scaled) < 999.5 or suffix == _SUFFIXES[-1][1]:
                return f"{scaled:.{max(digits, 3)}g}{suffix}"
    if a >= 1 or a == 0:
        return f"{value:.{max(digits, len(str(int(a))))}g}"
    return f"{value:.{digits}g}"


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels for one axis in one style: ``5k 10k 15k``, ``0 0.002 0.004``."""
    if not ticks:
        return []
    top = max(abs(t) for t in ticks)
    if top >= 1e4:
        div, suffix = next(((d, s) for d, s in _SUFFIXES if top / d < 999.5), _SUFFIXES[-1])
        return [f"{round(t / div, 6):g}{suffix}" if t else "0" for t in ticks]
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else top or 1.0
    decimals = max(0, 1 - math.floor(math.log10(step))) if step < 1 else 1
    return [f"{round(t, decimals):g}" for t in ticks]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2, 2.5 or 5 x 10^k) covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks: list[float] = []
    i = 0
    while first + i * step <= hi + step * 1e-9 and i < 100:
        ticks.append(round(first + i * step, 12))
        i += 1
    return ticks


@dataclass(frozen=True, slots=True)
class Scale:
    """Linear map from the data interval ``[lo, hi]`` to pixels ``[p0, p1]``."""

    lo: float
    hi: float
    p0: float
    p1: float

    @staticmethod
    def fit(values: Sequence[float], p0: float, p1: float, *, zero: bool = False) -> Scale:
        """A scale covering ``values`` with round ends; never of zero width."""
        finite = [v for v in values if math.isfinite(v)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        if zero:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        if hi == lo:  # a single value (or none): give it room
            pad = abs(lo) * 0.1 or 1.0
            lo, hi = lo - pad, hi + pad
            if zero and lo < 0 and all(v >= 0 for v in finite):
                lo = 0.0
        ticks = nice_ticks(lo, hi)
        if len(ticks) > 1:
            step = ticks[1] - ticks[0]
            lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
        return Scale(lo, hi, p0, p1)

    def __call__(self, value: float) -> float:
        span = self.hi - self.lo
        t = (value - self.lo) / span if span else 0.5
        return round(self.p0 + t * (self.p1 - self.p0), 2)

    def ticks(self, count: int = 5) -> list[float]:
        return [t for t in nice_ticks(self.lo, self.hi, count) if self.lo <= t <= self.hi]


def svg_open(width: float, height: float, title: str, desc: str = "") -> str:
    """Start a responsive SVG (scales to its container) with an accessible title."""
    out = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:g}" '
        f'width="{width:g}" height="{height:g}" role="img" aria-label="{esc(title)}" '
        f'font-family="{esc(FONT)}" font-size="11.5" fill="{TEXT}" class="chart">'
        f"<title>{esc(title)}</title>"
    )
    return out + (f"<desc>{esc(desc)}</desc>" if desc else "")


def svg_close() -> str:
    return "</svg>"


def text_width(text: str) -> float:
    return len(text) * _CHAR_W


@dataclass(frozen=True, slots=True)
class Axes:
    """The plotting area of a chart and its two scales."""

    x: Scale
    y: Scale

    @property
    def left(self) -> float:
        return min(self.x.p0, self.x.p1)

    @property
    def right(self) -> float:
        return max(self.x.p0, self.x.p1)

    @property
    def top(self) -> float:
        return min(self.y.p0, self.y.p1)

    @property
    def bottom(self) -> float:
        return max(self.y.p0, self.y.p1)

    def draw(self, x_label: str, y_label: str, *, y_ticks: bool = True, x_fmt: str = "num") -> str:
        """Grid lines, tick labels, axis lines and axis titles."""
        parts: list[str] = []
        if y_ticks:
            y_ticks_ = self.y.ticks()
            for t, label in zip(y_ticks_, tick_labels(y_ticks_), strict=True):
                y = self.y(t)
                parts.append(
                    f'<line x1="{self.left}" x2="{self.right}" y1="{y}" y2="{y}" '
                    f'stroke="{GRID}" stroke-width="1"/>'
                    f'<text x="{self.left - 8}" y="{y}" dy="0.32em" text-anchor="end" '
                    f'fill="{MUTED}">{esc(label)}</text>'
                )
        x_ticks = self.x.ticks(8)
        labels = tick_labels(x_ticks) if x_fmt == "num" else [_fmt_seconds(t) for t in x_ticks]
        for t, label in zip(x_ticks, labels, strict=True):
            x = self.x(t)
            parts.append(
                f'<line x1="{x}" x2="{x}" y1="{self.bottom}" y2="{self.bottom + 5}" '
                f'stroke="{AXIS}"/>'
                f'<text x="{x}" y="{self.bottom + 18}" text-anchor="middle" '
                f'fill="{MUTED}">{esc(label)}</text>'
            )
        parts.append(
            f'<line x1="{self.left}" x2="{self.right}" y1="{self.bottom}" y2="{self.bottom}" '
            f'stroke="{AXIS}"/>'
        )
        mid_x = (self.left + self.right) / 2
        parts.append(
            f'<text x="{mid_x}" y="{self.bottom + 38}" text-anchor="middle" '
            f'fill="{MUTED}" font-weight="600">{esc(x_label)}</text>'
        )
        if y_label:
            mid_y = (self.top + self.bottom) / 2
            parts.append(
                f'<text transform="translate(14 {mid_y}) rotate(-90)" text-anchor="middle" '
                f'fill="{MUTED}" font-weight="600">{esc(y_label)}</text>'
            )
        return "".join(parts)


def _fmt_seconds(t: float) -> str:
    if abs(t) >= 3600:
        return f"{t / 3600:.4g} h"
    if abs(t) >= 120:
        return f"{t / 60:.4g} min"
    return f"{t:g} s"


def _pts(*points: tuple[float, float]) -> str:
    return " ".join(f"{x:.2f},{y:.2f}" for x, y in points)


def marker(shape: str, x: float, y: float, color: str, size: float = 5.0) -> str:
    """A point marker (circle, square, diamond, triangle) with a white outline."""
    s = size
    stroke = 'stroke="#ffffff" stroke-width="1.2"'
    if shape == "square":
        return (
            f'<rect x="{x - s * 0.9:.2f}" y="{y - s * 0.9:.2f}" width="{s * 1.8:.2f}" '
            f'height="{s * 1.8:.2f}" fill="{color}" {stroke}/>'
        )
    if shape == "diamond":
        d = s * 1.25
        pts = _pts((x, y - d), (x + d, y), (x, y + d), (x - d, y))
        return f'<polygon points="{pts}" fill="{color}" {stroke}/>'
    if shape == "triangle":
        pts = _pts((x, y - s * 1.2), (x + s * 1.15, y + s * 0.9), (x - s * 1.15, y + s * 0.9))
        return f'<polygon points="{pts}" fill="{color}" {stroke}/>'
    return f'<circle cx="{x}" cy="{y}" r="{s}" fill="{color}" {stroke}/>'


def legend(items: Sequence[tuple[str, str, str]], x: float, y: float, max_x: float) -> str:
    """A one-line (wrapping) legend of ``(label, colour, kind)``.

    ``kind`` is ``line``, ``dashed``, ``band`` or a marker shape.
    """
    parts: list[str] = []
    cx, cy = x, y
    for label, color, kind in items:
        w = 26 + text_width(label) + 18
        if cx + w > max_x and cx > x:
            cx, cy = x, cy + 18
        if kind in ("line", "dashed"):
            dash = ' stroke-dasharray="5 3"' if kind == "dashed" else ""
            parts.append(
                f'<line x1="{cx}" x2="{cx + 18}" y1="{cy}" y2="{cy}" stroke="{color}" '
                f'stroke-width="2.5"{dash}/>'
            )
        elif kind == "band":
            parts.append(
                f'<rect x="{cx}" y="{cy - 6}" width="18" height="12" fill="{color}" rx="2"/>'
            )
        else:
            parts.append(marker(kind, cx + 9, cy, color, 4.5))
        parts.append(f'<text x="{cx + 24}" y="{cy}" dy="0.32em" fill="{MUTED}">{esc(label)}</text>')
        cx += w
    return "".join(parts)
