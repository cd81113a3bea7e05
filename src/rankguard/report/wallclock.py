"""Wall times read from a run's files, checked before they become dates.

A record can hold any number or string: a clock that was never set, a corrupt line, a
hand-edited file. A time before 1970 or past the year 9999, NaN, infinity or a malformed
ISO string is not a time: these helpers give ``None`` for it (shown as ``-``), so no
date formatting raises.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

__all__ = ["MAX_EPOCH_S", "epoch_s", "fmt_clock", "iso_epoch_s", "ns_epoch_s"]

MAX_EPOCH_S = 253402300799.0  # 9999-12-31 23:59:59 UTC, the last second datetime can show


def epoch_s(value: Any) -> float | None:
    """``value`` as epoch seconds when it is a possible wall time, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        return None
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_EPOCH_S:
        return None
    return seconds


def ns_epoch_s(value: Any) -> float | None:
    """Epoch nanoseconds (``wall_time_ns``) -> epoch seconds, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return epoch_s(value / 1e9)
    except OverflowError:
        return None


def iso_epoch_s(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 string, or ``None`` when it is not a possible time."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return epoch_s(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except (ValueError, OverflowError, OSError):
        return None


def fmt_clock(ts: float | None) -> str:
    """``2026-11-29 11:23:45 UTC``, or ``-`` when ``ts`` is not a possible time."""
    seconds = epoch_s(ts)
    if seconds is None:
        return "-"
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (ValueError, OverflowError, OSError):
        return "-"
