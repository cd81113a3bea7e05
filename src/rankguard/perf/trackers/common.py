"""What every tracker writes, in one place: scalar names, event lines, counts.

A perf window becomes the scalars of :data:`SCALARS` (the names of ``perf.jsonl`` under
``perf/``), at the window's training iteration (the script's numbering, which a resumed
job continues). A run event becomes a running count (``events/findings``,
``events/restarts``, ``events/checkpoints``) at its step, and one line of text. Node
0's goodput ledger (``goodput.json``, new at most every 30 s) becomes the scalars
``goodput/ettr``, ``goodput/wall_s`` and ``goodput/<part>_s`` (:func:`goodput_scalars`)
at the step of the moment it was read.
Trackers that log into the script's own run put every name under ``rankguard/``
(:data:`ATTACHED_PREFIX`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rankguard.schema.coerce import as_finite

__all__ = [
    "ATTACHED_PREFIX",
    "EVENT_KINDS",
    "GOODPUT",
    "SCALARS",
    "EventCounter",
    "event_line",
    "goodput_scalars",
    "scalars",
    "summary_scalars",
    "window_step",
]

ATTACHED_PREFIX = "rankguard/"
EVENT_KINDS = ("finding", "restart", "checkpoint")
#: The event kind of node 0's goodput ledger: scalars, not a counted event.
GOODPUT = "goodput"
_PART = re.compile(r"^[a-z_]{1,32}$")
_MAX_PARTS = 16
#: Window keys logged as scalars (``perf/<key>``); a None value is left out.
SCALARS = (
    "step_time_ms",
    "gpu_step_time_ms",
    "tokens_per_sec",
    "samples_per_sec",
    "TFLOPS_per_GPU",
    "TFLOPS_total",
    "MFU",
    "memory_GB",
    "peak_memory_GB",
    "data_loading_share",
)
_SUMMARY = (
    "avg_step_time_ms",
    "avg_gpu_step_time_ms",
    "median_step_time_ms",
    "avg_tflops_per_gpu",
    "avg_mfu",
    "avg_tokens_per_sec",
    "avg_samples_per_sec",
    "peak_memory_gb",
)


def window_step(entry: Mapping[str, Any]) -> int:
    """The step a window is logged at: its iteration, else its step count."""
    for key in ("iteration", "step"):
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def scalars(entry: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """``{prefix}perf/<key>: value`` for every known numeric field of a window."""
    out = {}
    for key in SCALARS:
        value = as_finite(entry.get(key))
        if value is not None:
            out[f"{prefix}perf/{key}"] = value
    return out


def summary_scalars(summary: Mapping[str, Any] | None, prefix: str = "") -> dict[str, float]:
    """The run summary's final statistics as ``{prefix}summary/<key>``."""
    stats = (summary or {}).get("final_statistics") or {}
    out = {}
    for key in _SUMMARY:
        value = as_finite(stats.get(key))
        if value is not None:
            out[f"{prefix}summary/{key}"] = value
    return out


def goodput_scalars(fields: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """A goodput event's ``{prefix}goodput/ettr``, ``goodput/wall_s`` and
    ``goodput/<part>_s`` (at most 16 parts, lower-case names)."""
    out = {}
    for key, name in (("ettr", "ettr"), ("wall_s", "wall_s")):
        value = as_finite(fields.get(key))
        if value is not None:
            out[f"{prefix}goodput/{name}"] = value
    parts = fields.get("parts_s")
    if isinstance(parts, Mapping):
        for part, seconds in list(parts.items())[:_MAX_PARTS]:
            value = as_finite(seconds)
            if isinstance(part, str) and _PART.match(part) and value is not None:
                out[f"{prefix}goodput/{part}_s"] = value
    return out


def event_line(kind: str, fields: Mapping[str, Any]) -> str:
    """One human line for a run event (bounded: trackers show it as text)."""
    f = fields
    if kind == "finding":
        text = f"{f.get('finding_type')} rank {f.get('rank')}: {f.get('message') or ''}"
        if f.get("action"):
            text += f" (action: {f.get('action')})"
    elif kind == "restart":
        text = (
            f"{f.get('kind') or 'process'} restart {f.get('restart')}: "
            f"{f.get('cause') or f.get('reason') or 'unknown cause'}"
            + (f" (rank {f.get('rank')})" if f.get("rank") is not None else "")
        )
    elif kind == "checkpoint":
        text = f"checkpoint step {f.get('step')} ({f.get('tier')}) committed"
        if as_finite(f.get("total_s")) is not None:
            text += f" in {f.get('total_s')} s"
    else:
        text = f"{kind}: {dict(f)}"
    return text[:1000]


class EventCounter:
    """Running count of each event kind (the scalar a tracker plots)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, kind: str) -> tuple[str, int]:
        """``events/<kind>s`` and its new count."""
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        return f"events/{kind}s", n
