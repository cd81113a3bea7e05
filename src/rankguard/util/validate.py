"""One check for every numeric setting of the component configs.

``check_number("process_timeout_s", value, gt=0)`` rejects NaN, +/-infinity and values
outside the bounds with a ``ValueError`` that names the setting; the config loader
prefixes the section (``heartbeat.process_timeout_s: ...``). A comparison alone would let
NaN through (every comparison with NaN is false), so a timeout of ``.nan`` would never
expire.
"""

from __future__ import annotations

import math

__all__ = ["check_number"]


def _bounds(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    low = f"{gt:g}" if gt is not None else f"{ge:g}" if ge is not None else None
    high = f"{lt:g}" if lt is not None else f"{le:g}" if le is not None else None
    if low is not None and high is not None:
        return f"in {'(' if gt is not None else '['}{low}, {high}{')' if lt is not None else ']'}"
    if low is not None:
        return f"{'>' if gt is not None else '>='} {low}"
    if high is not None:
        return f"{'<' if lt is not None else '<='} {high}"
    return ""


def check_number(
    name: str,
    value: object,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number within
    the given bounds (``gt``: >, ``ge``: >=, ``lt``: <, ``le``: <=)."""
    bounds = _bounds(gt, ge, lt, le)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value):  # type: ignore[arg-type]
        what = f"a finite number {bounds}".rstrip()
        raise ValueError(f"{name}: must be {what}, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if (
        (gt is not None and not number > gt)
        or (ge is not None and not number >= ge)
        or (lt is not None and not number < lt)
        or (le is not None and not number <= le)
    ):
        raise ValueError(f"{name}: must be {bounds}, got {value!r}")
