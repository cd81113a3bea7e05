"""What the status screen, the launcher's last lines and the report say beside the raw
numbers, so that none of them reads better than the run went.

- the ITER column: where each rank's iteration comes from (the heartbeat's
  ``iteration_source``): the script's own numbering is shown plain, a count of this
  process's steps or a resumed checkpoint's step plus the steps since carry a mark, and a
  legend under the table says what the marks mean;
- a launcher that is gone (SIGKILL, a dead node): its last status is frozen, so no rank
  is shown alive or progressing any more, only how it was last seen;
- restarts: each comes with its cause (a finding the launcher acted on, or the failure
  the agent saw: ``worker_failed`` for a rank that died without a finding, e.g. killed
  from outside);
- an exit after the launcher stopped the workers (a signal), a restart or a peer's
  failure is said as such, not as a rank's error.

Pure functions of ``status.json``'s dicts and typed blocks and of ``restarts.jsonl``'s
entries (tolerant of missing keys); no I/O. The launcher's console lines use them too
(:mod:`rankguard.launcher.console`).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence

from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.restarts import RestartEntry
from rankguard.schema.status import RankExit, RankRow, StatusDoc

__all__ = [
    "ITERATION_MARKS",
    "exit_note",
    "frozen_status",
    "iteration_cell",
    "iteration_legend",
    "restart_cause",
    "restarts_summary",
]

#: Mark after an ITER value, per ``iteration_source``; the script's numbering has none.
ITERATION_MARKS = {"script": "", "checkpoint": "+", "steps": "*"}
_LEGEND = {
    "steps": "* steps this process counted (optimizer steps; the script's own numbering "
    "is not known)",
    "checkpoint": "+ the resumed checkpoint's step plus the steps since",
}
_LIVE = ("alive", "stale", "not_observed")
_UNFINISHED_PROGRESS = ("starting", "progressing", "stalled", "not_observed")


def iteration_cell(rank: RankRow | JsonObject) -> str:
    """``41*``, ``2000+`` or ``2000`` (the script's), ``-`` when not known."""
    row = rank if isinstance(rank, RankRow) else RankRow.from_dict(rank)
    if row.iteration is None:
        return "-"
    return f"{row.iteration}{ITERATION_MARKS.get(str(row.iteration_source), '')}"


def iteration_legend(ranks: Sequence[RankRow | JsonObject]) -> str | None:
    """The line under the rank table that explains the marks in use (None: none used)."""
    rows = [r if isinstance(r, RankRow) else RankRow.from_dict(r) for r in ranks]
    used = {
        str(r.iteration_source)
        for r in rows
        if r.iteration is not None and ITERATION_MARKS.get(str(r.iteration_source))
    }
    parts = [_LEGEND[k] for k in ("steps", "checkpoint") if k in used]
    return "ITER: " + "; ".join(parts) if parts else None


def exit_note(exit_info: RankExit | JsonObject) -> str | None:
    """Why a rank's process ended without a finding: the launcher stopped it, a restart
    or another rank's failure took it down (None: a plain exit)."""
    ex = exit_info if isinstance(exit_info, RankExit) else RankExit.from_json(exit_info)
    if ex.after_shutdown:
        return "stopped"
    if ex.after_restart:
        return "restart"
    if ex.after_action:  # a restart was noted, none came: the job ended
        return "no restart"
    if ex.after_failure_of_rank is not None:
        return f"after rank {ex.after_failure_of_rank}"
    return None


def frozen_status(status: JsonObject) -> JsonObject:
    """The status of a launcher that no longer runs: every rank not seen ending is
    ``unknown`` (it may have died with the launcher, or still run unwatched), the counts
    and the state say the same. A copy; ``status`` is left as it is."""
    doc = StatusDoc.from_dict(copy.deepcopy(status))
    for row in doc.ranks:
        if row.process_liveness in _LIVE:
            row.process_liveness = "unknown"
        if row.gpu_progress in _UNFINISHED_PROGRESS:
            row.gpu_progress = "unknown"
    summary = doc.summary
    if summary.present:
        summary.process_liveness = _merged(summary.process_liveness, _LIVE)
        summary.gpu_progress = _merged(summary.gpu_progress, _UNFINISHED_PROGRESS)
    if doc.state in ("starting", "running", "degraded"):
        doc.state = f"unknown (launcher gone; last: {doc.state})"
    return doc.to_dict()


def _merged(counts: dict[str, int], moved: tuple[str, ...]) -> dict[str, int]:
    """``counts`` with the states in ``moved`` counted as ``unknown``."""
    merged: Counter[str] = Counter()
    for name, n in counts.items():
        merged["unknown" if name in moved else name] += n
    return {k: n for k, n in merged.items() if n}


def restart_cause(entry: RestartEntry) -> str:
    """``worker_failed rank 1: Signal 9 (SIGKILL) received by PID 9853`` (the cause, the
    rank and the first line of the message)."""
    text = entry.cause or "unknown cause"
    if entry.rank is not None:
        text += f" rank {entry.rank}"
    message = (entry.message or "").strip()
    if message:
        text += ": " + message.splitlines()[0][:200]
    return text


def restarts_summary(entries: Sequence[RestartEntry]) -> str | None:
    """``1 restart (worker_failed rank 1: ...)``, or ``3 restarts (last: ...)``; None
    without any."""
    if not entries:
        return None
    if len(entries) == 1:
        return f"1 restart ({restart_cause(entries[0])})"
    causes = Counter(r.cause or "unknown cause" for r in entries)
    by_cause = ", ".join(f"{c} x{n}" if n > 1 else c for c, n in causes.items())
    return f"{len(entries)} restarts ({by_cause}; last: {restart_cause(entries[-1])})"
