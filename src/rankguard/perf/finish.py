"""The perf summary of a run whose rank 0 did not close it, completed from ``perf.jsonl``.

Rank 0's reporter rewrites ``perf_summary_<ts>.json`` at most every 30 s and a last time
when it closes. A rank that is stopped (a SIGTERM to the launcher, fault tolerance's
kill, a crash) never closes: its summary stays at an early window while ``perf.jsonl``
went on, and a report would show the iterations of one beside the averages of the
other. After the workers are gone, node 0's launcher (:func:`complete_summary`) rebuilds
the summary from the windows of the last attempt in ``perf.jsonl`` when the summary
covers fewer steps than they do. A window gives its steps' mean time only, so the
statistics are per window (``statistics_source`` says so); the rest of the session
information (FLOPs, peak, dtype, world size) is the summary's own.

``perf.jsonl`` is written by the training process: each line is parsed and checked
(numbers where numbers are expected), and at most :data:`MAX_LINES` of them are read.

The same launcher then writes the job's ETTR (productive training over wall time, from
the goodput ledger of its final status) into the summary's ``final_statistics``
(:func:`add_ettr`): rank 0 closes its summary before the job is over and cannot know
it. A summary not written through rankguard's launcher keeps ``"ettr": null``.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rankguard.perf.flops import mfu, tflops_per_gpu
from rankguard.schema.coerce import as_dict, as_finite
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import PERF_LOG_FILE, PERF_SUMMARY_GLOB
from rankguard.util.fs import atomic_write_json

__all__ = [
    "MAX_LINES",
    "STATISTICS_FROM_WINDOWS",
    "add_ettr",
    "complete_summary",
    "last_attempt",
]

logger = logging.getLogger(__name__)

MAX_LINES = 1_000_000
STATISTICS_FROM_WINDOWS = (
    "perf.jsonl windows: rank 0 ended without closing its summary (stopped or killed)"
)


@dataclass(frozen=True, slots=True)
class _Window:
    """One window of ``perf.jsonl``: the figures the summary is computed from, narrowed
    (``line``: the window as written)."""

    step: float
    steps: float  # steps_in_window, >= 1
    step_time_ms: float
    gpu_step_time_ms: float | None
    includes_startup: bool
    peak_memory_gb: float | None
    line: JsonObject

    @classmethod
    def parse(cls, raw: bytes) -> _Window | None:
        try:
            line = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(line, dict):
            return None
        step, n = as_finite(line.get("step")), as_finite(line.get("steps_in_window"))
        ms = as_finite(line.get("step_time_ms"))
        if step is None or n is None or n < 1 or ms is None:
            return None
        return cls(
            step=step,
            steps=n,
            step_time_ms=ms,
            gpu_step_time_ms=as_finite(line.get("gpu_step_time_ms")),
            includes_startup=bool(line.get("includes_startup")),
            peak_memory_gb=as_finite(line.get("peak_memory_GB")),
            line=line,
        )


def _last_attempt(path: Path) -> list[_Window]:
    windows: list[_Window] = []
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            if i >= MAX_LINES:
                break
            window = _Window.parse(raw)
            if window is None:
                continue
            if windows and window.step <= windows[-1].step:
                windows = []
            windows.append(window)
    return windows


def last_attempt(path: Path) -> list[JsonObject]:
    """The windows of ``perf.jsonl`` written by its last attempt (an in-job restart
    numbers its steps from 1 again: a step not above the one before starts an attempt)."""
    return [w.line for w in _last_attempt(path)]


@dataclass(frozen=True, slots=True)
class _Stats:
    steps: int
    avg: float
    median: float
    min: float
    max: float
    gpu: float | None


def _stats(windows: list[_Window], warmup: int) -> _Stats:
    """Mean, median, min and max step time over the windows after warm-up (each window's
    mean weighted by its steps), and the mean GPU step time where there is one."""
    kept = [w for w in windows if w.step > warmup and not w.includes_startup]
    if not kept:
        kept = windows[len(windows) // 2 :]
    steps = sum(int(w.steps) for w in kept)
    times = sorted(w.step_time_ms for w in kept)
    gpu = [(w.gpu_step_time_ms, w.steps) for w in kept if w.gpu_step_time_ms is not None]
    return _Stats(
        steps=steps,
        avg=sum(w.step_time_ms * int(w.steps) for w in kept) / steps,
        median=statistics.median(times),
        min=times[0],
        max=times[-1],
        gpu=sum(t * n for t, n in gpu) / sum(n for _, n in gpu) if gpu else None,
    )


def _global(windows: list[_Window], key: str) -> float | None:
    """The global batch in samples or tokens, from the last window that gives a rate."""
    for w in reversed(windows):
        rate, ms = as_finite(w.line.get(key)), w.gpu_step_time_ms or w.step_time_ms
        if rate is not None:
            return rate * ms / 1e3
    return None


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.6g}")


def completed(summary: JsonObject, windows: list[_Window]) -> JsonObject:
    """``summary`` with its totals and statistics taken from ``windows``."""
    info = dict(as_dict(summary.get("session_info")) or {})
    warmup = int(as_finite(info.get("warmup_iterations")) or 0)
    stats = _stats(windows, warmup)
    world = int(as_finite(info.get("world_size")) or 1)
    flops, peak = as_finite(info.get("flops_per_step")), as_finite(info.get("peak_tflops_per_gpu"))
    rate_s = (stats.gpu or stats.avg) / 1e3
    per_gpu = tflops_per_gpu(flops, rate_s, world) if flops and rate_s > 0 else None
    samples, tokens = _global(windows, "samples_per_sec"), _global(windows, "tokens_per_sec")
    peaks = [w.peak_memory_gb for w in windows if w.peak_memory_gb is not None]
    last = windows[-1]
    info.update(
        end_time=str(last.line.get("timestamp") or datetime.now(timezone.utc).isoformat()),
        total_iterations=int(last.step),
        steps_in_statistics=stats.steps,
        statistics_source=STATISTICS_FROM_WINDOWS,
    )
    return {
        **summary,
        "session_info": info,
        "final_statistics": {
            "avg_tflops_per_gpu": _r(per_gpu),
            "avg_tflops_total": _r(per_gpu * world) if per_gpu else None,
            "avg_mfu": _r(mfu(per_gpu, peak)) if per_gpu and peak else None,
            "avg_step_time_ms": _r(stats.avg),
            "avg_gpu_step_time_ms": _r(stats.gpu),
            "median_step_time_ms": _r(stats.median),
            "min_step_time_ms": _r(stats.min),
            "max_step_time_ms": _r(stats.max),
            "avg_samples_per_sec": _r(samples / rate_s) if samples and rate_s > 0 else None,
            "avg_tokens_per_sec": _r(tokens / rate_s) if tokens and rate_s > 0 else None,
            "peak_memory_gb": _r(max(peaks)) if peaks else None,
            "ettr": as_finite((as_dict(summary.get("final_statistics")) or {}).get("ettr")),
        },
        "iteration_logs": [w.line for w in windows[-10_000:]],
    }


def complete_summary(perf_dir: Path) -> Path | None:
    """Rewrite the run's summary from ``perf.jsonl`` when it covers fewer steps than
    the last attempt's windows there; the summary's path when it was rewritten."""
    log = perf_dir / PERF_LOG_FILE
    summaries = sorted(perf_dir.glob(PERF_SUMMARY_GLOB))
    if not log.is_file() or not summaries:
        return None
    path = summaries[-1]
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        windows = _last_attempt(log)
    except (OSError, ValueError) as exc:
        logger.warning("perf summary %s: cannot complete it: %s", path, exc)
        return None
    if not isinstance(summary, dict) or not windows:
        return None
    info = summary.get("session_info")
    covered = as_finite(info.get("total_iterations")) if isinstance(info, dict) else None
    if covered is not None and covered >= windows[-1].step:
        return None  # rank 0 closed it (or it is as far as perf.jsonl)
    try:
        atomic_write_json(path, completed(summary, windows))
    except OSError as exc:
        logger.warning("perf summary %s: cannot complete it: %s", path, exc)
        return None
    return path


def add_ettr(perf_dir: Path, ettr: float | None) -> Path | None:
    """Set ``final_statistics.ettr`` of the run's latest summary to the job's ETTR
    (the launcher's goodput ledger); the summary's path when it was rewritten."""
    value = as_finite(ettr)
    summaries = sorted(perf_dir.glob(PERF_SUMMARY_GLOB))
    if value is None or not summaries:
        return None
    path = summaries[-1]
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        logger.warning("perf summary %s: cannot add the ETTR: %s", path, exc)
        return None
    stats = summary.get("final_statistics") if isinstance(summary, dict) else None
    if not isinstance(stats, dict):
        return None
    stats["ettr"] = value  # as the final status has it
    try:
        atomic_write_json(path, summary)
    except OSError as exc:
        logger.warning("perf summary %s: cannot add the ETTR: %s", path, exc)
        return None
    return path
