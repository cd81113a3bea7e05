"""FlagScale's names for the facts a finding carries (a superset of its finding lines).

FlagScale's heartbeat monitor writes its findings with ``detected_at_unix_ns``,
``timeout_type`` (``initial_process_heartbeat``, ``subsequent_process_heartbeat``,
``initial_gpu_progress``, ``subsequent_gpu_progress``), ``heartbeat_age_s`` /
``progress_age_s``, ``confidence`` (``observed`` for a rank never seen, else
``suspected``) and ``gpu_device_health`` (the GPU's verdict, ``not_collected`` without
hardware health). rankguard writes the same facts under its own names
(``detected_wall_time``, ``reason``, ``observed_s``, ``gpu_health``) and, beside them,
these: a script written for FlagScale's ``findings.jsonl`` reads rankguard's as it is.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from rankguard.schema.jsontypes import JsonObject

__all__ = ["FLAGSCALE_KEYS", "flagscale_fields"]

#: The keys :func:`flagscale_fields` writes: derived, so a reader drops them.
FLAGSCALE_KEYS = frozenset(
    {
        "detected_at_unix_ns",
        "timeout_type",
        "heartbeat_age_s",
        "progress_age_s",
        "confidence",
        "gpu_device_health",
    }
)

_PROCESS = "rank_process_heartbeat_timeout"
_PROGRESS = "gpu_progress_timeout"
_NEVER_SEEN = "rank_process_heartbeat_never_observed"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _unix_ns(iso: Any) -> int | None:
    if not isinstance(iso, str):
        return None
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    # exact integer arithmetic (a float timestamp loses the last digits)
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def flagscale_fields(finding: JsonObject) -> JsonObject:
    """FlagScale's fields for one finding line (``finding``: rankguard's fields)."""
    ftype, reason = finding.get("finding_type"), finding.get("reason")
    out: JsonObject = {}
    ns = _unix_ns(finding.get("detected_wall_time"))
    if ns is not None:
        out["detected_at_unix_ns"] = ns
    age = finding.get("observed_s")
    if ftype == _PROCESS:
        never = reason == _NEVER_SEEN
        started = finding.get("iteration") is not None or not never
        out["timeout_type"] = (
            "initial_process_heartbeat" if never or not started else "subsequent_process_heartbeat"
        )
        if age is not None:
            out["heartbeat_age_s"] = age
        out["confidence"] = "observed" if never else "suspected"
    elif ftype == _PROGRESS:
        first = finding.get("iteration") is None and finding.get("phase") in (None, "setup")
        out["timeout_type"] = "initial_gpu_progress" if first else "subsequent_gpu_progress"
        if age is not None:
            out["progress_age_s"] = age
        out["confidence"] = "suspected"
    health = finding.get("gpu_health")
    verdict = health.get("health") if isinstance(health, dict) else None
    out["gpu_device_health"] = verdict if isinstance(verdict, str) else "not_collected"
    return out
