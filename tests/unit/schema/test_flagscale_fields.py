"""Findings carry FlagScale's field names beside rankguard's (FlagScale's heartbeat
monitor: detected_at_unix_ns, timeout_type, *_age_s, confidence, gpu_device_health)."""

from __future__ import annotations

from rankguard.schema.flagscale import flagscale_fields


def test_never_seen_rank() -> None:
    out = flagscale_fields(
        {
            "finding_type": "rank_process_heartbeat_timeout",
            "reason": "rank_process_heartbeat_never_observed",
            "observed_s": 31.5,
            "detected_wall_time": "2026-12-01T21:47:19.830+00:00",
        }
    )
    assert out == {
        "detected_at_unix_ns": 1796161639830000000,
        "timeout_type": "initial_process_heartbeat",
        "heartbeat_age_s": 31.5,
        "confidence": "observed",
        "gpu_device_health": "not_collected",
    }


def test_stale_process_and_stalled_progress() -> None:
    stale = flagscale_fields(
        {
            "finding_type": "rank_process_heartbeat_timeout",
            "reason": "rank_process_or_heartbeat_thread_unresponsive",
            "iteration": 12,
            "observed_s": 9.8,
        }
    )
    assert stale["timeout_type"] == "subsequent_process_heartbeat"
    assert stale["confidence"] == "suspected" and "detected_at_unix_ns" not in stale
    stalled = flagscale_fields(
        {
            "finding_type": "gpu_progress_timeout",
            "reason": "rank_alive_but_gpu_progress_not_advancing",
            "phase": "train",
            "iteration": 12,
            "observed_s": 4.2,
            "gpu_health": {"health": "warning", "stale": False},
        }
    )
    assert stalled["timeout_type"] == "subsequent_gpu_progress"
    assert stalled["progress_age_s"] == 4.2 and stalled["gpu_device_health"] == "warning"
    first = flagscale_fields(
        {"finding_type": "gpu_progress_timeout", "reason": "x", "phase": "setup"}
    )
    assert first["timeout_type"] == "initial_gpu_progress"


def test_other_types_only_get_the_common_fields() -> None:
    out = flagscale_fields({"finding_type": "straggler_detected", "reason": "y"})
    assert out == {"gpu_device_health": "not_collected"}
