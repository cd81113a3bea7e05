"""Reading node 0's monitor files from outside the job: ``status.json``, ``findings.jsonl``.

The monitor atomically replaces ``status.json`` every scan and appends to
``findings.jsonl`` (schemas in ``docs/heartbeat.md``); these readers only read them, so
they are safe at any time, from any host that sees the log directory, while the job
runs or after it died. ``rankguard status`` uses them; like the file names
(:mod:`rankguard.schema.layout`) they are library code, so no library module needs the
CLI. No torch import here.

The readers are tolerant on purpose: a malformed or partially written ``findings.jsonl``
line is skipped, and an unusable ``status.json`` raises :class:`StatusUnavailable` with
a message saying why rather than a traceback.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from rankguard.scheduler import exclusion_hint_lines
from rankguard.schema.coerce import as_list
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import (
    CHECKPOINTS_FILE,
    EXCLUDED_NODES_FILE,
    FINDINGS_FILE,
    STATUS_FILE,
    STATUS_RANKS_FILE,
)
from rankguard.schema.status import FINAL_STATES, RankRow, RankTable, StatusDoc, raw_rank_rows
from rankguard.util.procs import pid_running, process_start_time

__all__ = [
    "FINAL_STATES",
    "StatusUnavailable",
    "excluded_lines",
    "latest_findings",
    "launcher_gone",
    "load_status",
    "parse_rank_spec",
    "rank_rows",
    "read_checkpoints",
    "read_excluded",
    "read_findings",
    "worst_rows",
]

_CHUNK = 64 * 1024  # bytes read per step when tailing findings.jsonl backwards
MAX_LINE = 8 << 20  # a longer line is skipped (no finding is that long)


class StatusUnavailable(Exception):
    """The run directory or its status.json cannot be used; the message says why."""


def launcher_gone(status: JsonObject, hostname: str | None = None) -> str | None:
    """Why ``status`` is the last word of a launcher that is gone (SIGKILLed, its node
    lost), or None when it is alive, the job reached a final state, or it cannot be
    told from here (the launcher ran on another host: ``monitor.hostname``).

    The monitor writes its launcher's pid and start time (``monitor.pid``,
    ``monitor.pid_start``) in every status: a pid that no longer runs, or that another
    process took since, means nobody updates this status any more."""
    doc = StatusDoc.from_dict(status)
    if doc.state in FINAL_STATES:
        return None
    monitor = doc.monitor
    pid, started = monitor.pid, monitor.pid_start
    if pid is None or pid <= 1:
        return None
    if monitor.hostname != (hostname or socket.gethostname()):
        return None
    if not pid_running(pid):
        return f"launcher gone (pid {pid} no longer runs: killed?); this status is its last"
    if started is not None and process_start_time(pid) not in (None, started):
        return f"launcher gone (pid {pid} is another process now: killed?); this status is its last"
    return None


def _parse_line(raw: bytes) -> JsonObject | None:
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def read_findings(path: str | os.PathLike[str], limit: int) -> list[JsonObject]:
    """The last ``limit`` valid JSON objects of ``findings.jsonl``, oldest first.

    The file is read backwards in chunks, so a long file costs only its tail. Malformed
    lines and a partially written last line are skipped. A missing file means no findings
    yet and gives ``[]``; other I/O errors propagate.
    """
    if limit <= 0:
        return []
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with block below
    except FileNotFoundError:
        return []
    found: list[JsonObject] = []

    def take(raw: bytes) -> bool:
        rec = _parse_line(raw)
        if rec is not None:
            found.append(rec)
        return len(found) >= limit

    with fh:
        pos = fh.seek(0, os.SEEK_END)
        # The line being assembled, in pieces as read (backwards): joined once when its
        # start is found, so a long line costs its length, not its length squared.
        pending: list[bytes] = []
        pending_len = 0
        overlong = False
        done = False
        while pos > 0 and not done:
            step = min(_CHUNK, pos)
            pos -= step
            fh.seek(pos)
            parts = fh.read(step).split(b"\n")
            if len(parts) == 1:  # no line boundary in this chunk
                pending.append(parts[0])
                pending_len += len(parts[0])
                if pending_len > MAX_LINE:  # skipped, never joined
                    pending, pending_len, overlong = [], 0, True
                continue
            last = b"".join([parts[-1], *reversed(pending)])
            if not overlong and len(last) <= MAX_LINE:
                done = take(last)
            for raw in reversed(parts[1:-1]):
                if done:
                    break
                if len(raw) <= MAX_LINE:
                    done = take(raw)
            pending, pending_len, overlong = [parts[0]], len(parts[0]), False
        if pos == 0 and not done and not overlong and pending_len <= MAX_LINE:
            take(b"".join(reversed(pending)))
    found.reverse()
    return found


def load_status(run_dir: Path) -> JsonObject:
    """``run_dir``'s ``status.json``; :class:`StatusUnavailable` when missing or unusable."""
    path = run_dir / STATUS_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as exc:
        raise StatusUnavailable(f"no {STATUS_FILE} in {run_dir}") from exc
    except OSError as exc:
        raise StatusUnavailable(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StatusUnavailable(
            f"{path} is malformed or partially written ({exc}); "
            "the monitor replaces it atomically, so another process may have written it"
        ) from exc
    if not isinstance(obj, dict):
        raise StatusUnavailable(
            f"{path} is malformed: expected a JSON object, got {type(obj).__name__}"
        )
    return obj


def latest_findings(run_dir: Path, status: JsonObject, limit: int) -> list[JsonObject]:
    """Latest findings from findings.jsonl, or status.json's copy when the file is absent."""
    if limit <= 0:
        return []
    if (run_dir / FINDINGS_FILE).exists():
        return read_findings(run_dir / FINDINGS_FILE, limit)
    return StatusDoc.from_dict(status).recent_findings[-limit:]


def read_checkpoints(run_dir: Path) -> JsonObject | None:
    """The checkpoint state rank 0's ``CheckpointManager`` keeps in ``checkpoints.json``
    (last committed per tier, durations, the write in flight); None when the job has
    none or the file cannot be read (it is replaced atomically: never torn)."""
    try:
        obj = json.loads((run_dir / CHECKPOINTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def parse_rank_spec(spec: str) -> set[int]:
    """``"10-20,35"`` -> {10, ..., 20, 35}; ``ValueError`` naming the bad part."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ValueError(f"not a rank or a range A-B: {part!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"not a range of ranks: {part!r}")
        if last - first > 1_000_000:
            raise ValueError(f"range too long: {part!r}")
        out.update(range(first, last + 1))
    return out


def rank_rows(run_dir: Path, status: JsonObject, ranks: set[int]) -> list[JsonObject]:
    """The rows of ``ranks``: status.json's when it lists every rank (or lists them),
    else ``status_ranks.json``'s (a large job's monitor writes every rank there
    periodically; status.json's fresher row wins where it has one)."""
    listed = {RankRow.from_dict(r).rank: r for r in raw_rank_rows(status)}
    complete = StatusDoc.from_dict(status).rank_detail.complete
    if complete or all(r in listed for r in ranks):
        return [listed[r] for r in sorted(ranks) if r in listed]
    rows = _detail_rows(run_dir, ranks)
    rows.update({r: row for r, row in listed.items() if r in ranks})
    return [rows[r] for r in sorted(rows)]


def _detail_rows(run_dir: Path, ranks: set[int]) -> dict[int, JsonObject]:
    path = run_dir / STATUS_RANKS_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StatusUnavailable(
            f"no {STATUS_RANKS_FILE} in {run_dir} yet: the monitor writes it every "
            "heartbeat.status_detail_interval_s"
        ) from None
    except (OSError, ValueError, RecursionError) as exc:
        raise StatusUnavailable(f"cannot read {path}: {exc}") from exc
    table = RankTable.from_json(doc)
    if table is None:
        raise StatusUnavailable(f"{path} is malformed: no columns")
    return table.rows_of(ranks)


_BAD_PROGRESS = ("stalled", "unknown")


def worst_rows(rows: list[RankRow], n: int) -> list[RankRow]:
    """The ``n`` rows most in need of a look: an active finding, then stale, stalled or
    ended in error, then the longest without progress (the monitor's order)."""

    def badness(r: RankRow) -> tuple[int, float]:
        if r.active_findings:
            tier = 0
        elif r.process_liveness == "stale" or r.gpu_progress in _BAD_PROGRESS:
            tier = 1
        else:
            tier = 2
        return tier, -(r.progress_age_s or r.heartbeat_age_s or 0.0)

    return sorted(rows, key=badness)[: max(0, n)]


def read_excluded(run_dir: str | os.PathLike[str]) -> JsonObject | None:
    """Bad-node exclusion's ``excluded_nodes.json`` of a run directory (the hosts to
    leave out, each excluded node and why), or None."""
    try:
        with open(Path(run_dir) / EXCLUDED_NODES_FILE, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def excluded_lines(run_dir: str | os.PathLike[str]) -> list[str]:
    """What ``rankguard status`` says about the run's excluded nodes (none: [])."""
    data = read_excluded(run_dir)
    if not data or not data.get("hosts"):
        return []
    nodes = [n for n in as_list(data.get("nodes")) if isinstance(n, dict)]
    out = [
        f"excluded: {', '.join(str(h) for h in as_list(data.get('hosts')))}"
        + (" (below --nnodes MIN: the job ended)" if data.get("below_min_nodes") else "")
    ]
    for n in nodes:
        where = f"node {n['node_rank']}" if n.get("node_rank") is not None else "a node"
        problems = ", ".join(str(p) for p in as_list(n.get("problems"))) or "-"
        out.append(
            f"  {where} on {n.get('hostname')} (launcher pid {n.get('pid')}): "
            f"{n.get('trigger')}, GPU {n.get('gpu')}: {problems}"
        )
    return out + exclusion_hint_lines(data)  # each scheduler's way to leave them out
