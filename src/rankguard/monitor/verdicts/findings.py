"""How a verdict says what it found: once per episode (:func:`fire` adds the type to the
rank's active set; :func:`clear` ends the episode, so a relapse fires again), one
message per finding type, the figures as they were measured."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.schema.coerce import as_list
from rankguard.schema.findings import Finding, FindingType, Liveness, Progress, Reason
from rankguard.schema.jsontypes import JsonObject

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = ["clear", "fire", "rank_finding", "unseen_finding"]


def clear(s: RankState, *types: FindingType) -> None:
    """The episodes of ``types`` of rank ``s`` are over (the condition cleared)."""
    for t in types:
        s.active.discard(t)


def fire(
    run_id: str,
    s: RankState,
    ftype: FindingType,
    reason: Reason,
    timeout_s: float | None,
    observed_s: float | None,
    out: list[Finding],
    *,
    detail: JsonObject | None = None,
) -> None:
    """A finding of ``ftype`` about rank ``s`` into ``out``, unless its episode is on."""
    if ftype in s.active:
        return
    s.active.add(ftype)
    s.fired.add(ftype)
    found = rank_finding(run_id, s, ftype, reason, timeout_s, observed_s)
    found.detail.update(detail or {})
    out.append(found)


def rank_finding(
    run_id: str,
    s: RankState,
    ftype: FindingType,
    reason: Reason,
    timeout_s: float | None,
    observed_s: float | None,
    message: str | None = None,
) -> Finding:
    """The finding about rank ``s`` as the monitor sees it now."""
    rec = s.record
    observed_s = _reported(observed_s, timeout_s)
    return Finding.build(
        ftype,
        reason,
        run_id=run_id,
        rank=s.rank,
        message=message or _message(ftype, reason, s, timeout_s, observed_s),
        record=rec,
        pid=s.pid,
        process_liveness=s.liveness,
        gpu_progress=s.progress,
        checkpoint_active=rec.checkpoint_active if rec else False,
        timeout_s=timeout_s,
        observed_s=observed_s,
        gpu_health=s.gpu_health,
        exit=rec.exit if rec else None,
        main_frame=rec.main_frame if rec else None,
    )


def unseen_finding(
    run_id: str, rank: int, timeout_s: float, observed_s: float, message: str
) -> Finding:
    """The finding about rank ``rank``, never seen (no record, no process)."""
    return Finding.build(
        FindingType.PROCESS_TIMEOUT,
        Reason.NEVER_OBSERVED,
        run_id=run_id,
        rank=rank,
        message=message,
        record=None,
        pid=None,
        process_liveness=Liveness.NOT_OBSERVED,
        gpu_progress=Progress.NOT_OBSERVED,
        checkpoint_active=False,
        timeout_s=timeout_s,
        observed_s=_reported(observed_s, timeout_s),
        gpu_health=None,
        exit=None,
        main_frame=None,
    )


def _reported(observed_s: float | None, timeout_s: float | None) -> float | None:
    """``observed_s`` to the millisecond, never rounded down onto the limit it passed.

    A finding fires on ``observed > timeout``; 4.0004 s past a 4 s limit would read
    ``observed_s: 4.0``, which says the limit was not passed.
    """
    if observed_s is None:
        return None
    shown = round(observed_s, 3)
    if timeout_s is not None and observed_s > timeout_s >= shown:
        shown = math.floor(timeout_s * 1000 + 1) / 1000
    return shown


def _message(
    ftype: FindingType,
    reason: Reason,
    s: RankState,
    timeout_s: float | None,
    observed_s: float | None,
) -> str:
    rec = s.record
    assert rec is not None
    who = f"rank {s.rank} (pid {s.pid} on {rec.hostname})"
    where = f"phase {rec.phase}, iteration {rec.iteration}"
    observed = "?"
    if observed_s is not None:
        # One decimal, or three where one would print the limit itself ("4.0s > 4s").
        digits = 1 if timeout_s is None or round(observed_s, 1) > timeout_s else 3
        observed = f"{observed_s:.{digits}f}"
    if ftype is FindingType.PROCESS_TIMEOUT:
        return (
            f"{who}: no heartbeat for {observed}s > {timeout_s:g}s; the process or "
            f"its heartbeat thread is unresponsive (stopped, swapping or dead) [{where}]"
        )
    if ftype is FindingType.NODE_DISK_FULL:
        return (
            f"{who}: no heartbeat for {observed}s > {timeout_s:g}s while the disk of "
            f"node {rec.node_rank or 0} is full: its heartbeats cannot be written; reported, "
            f"not killed (free space on that node ends it) [{where}]"
        )
    if ftype is FindingType.PROGRESS_TIMEOUT:
        return f"{who}: alive but no step completed for {observed}s > {timeout_s:g}s [{where}]"
    if ftype is FindingType.PROCESS_EXITED:
        exit_info = rec.exit or {}
        if reason is Reason.DIED:
            return f"{who}: process vanished without a clean end (killed or crashed) [{where}]"
        early = exit_info.get("peers_ended_first")
        why = (
            f" (its peer(s) {', '.join(map(str, early))} had exited cleanly before it: "
            "they left the job early)"
            if isinstance(early, list) and early
            else ""
        )
        return (
            f"{who}: exited with an error (exit code {exit_info.get('exit_code')}): "
            f"{exit_info.get('error')}{why} [{where}]"
        )
    if ftype is FindingType.SECTION_TIMEOUT:
        what = "section" if reason is Reason.SECTION_EXCEEDED else "out-of-section phase"
        return f"{who}: {what} {rec.phase!r} has lasted {observed}s > {timeout_s:g}s [{where}]"
    problems = ", ".join(map(str, as_list((s.gpu_health or {}).get("problems"))))
    problems = problems or "see gpu_health"
    level = "unhealthy" if ftype is FindingType.HEALTH_FAILURE else "warning"
    return f"{who}: its GPU is {level}: {problems}"
