"""Load everything the report shows about one run, whatever state its files are in.

A run leaves two directories: ``<log_dir>/heartbeat/<run_id>/`` (node 0's monitor:
``status.json``, ``findings.jsonl``, ``perf_ranks.jsonl``, GPU health snapshots, launcher
records and one heartbeat stream per rank process) and ``<log_dir>/perf_monitor/<run_id>/``
(rank 0's ``perf.jsonl`` and ``perf_summary_<ts>.json``). Either may be missing: the
heartbeat monitor or the perf monitor can be disabled, and a job killed early leaves
partial files.

So the loader never raises on content. A missing file becomes a sentence in
``RunData.missing``, a malformed file or line a sentence in ``RunData.problems``, and the
page shows both. Only a directory with nothing recognisable in it is an error
(:class:`ReportUnavailable`), because then there is no run to report on.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from rankguard.ft.policy import STOP_KIND
from rankguard.goodput import Ledger, read_ledger
from rankguard.report.wallclock import iso_epoch_s, ns_epoch_s
from rankguard.schema.coerce import as_list, as_str
from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import (
    FINDINGS_FILE,
    HEALTH_FILE_RE,
    HEARTBEAT_FILE_RE,
    HEARTBEAT_ROOT,
    LAUNCHER_FILE_RE,
    PERF_LOG_FILE,
    PERF_RANKS_FILE,
    PERF_ROOT,
    PERF_SUMMARY_GLOB,
    RESTARTS_FILE,
    STATUS_FILE,
)
from rankguard.schema.restarts import RestartEntry
from rankguard.schema.status import StatusDoc, parse_findings

__all__ = ["ProcessSpan", "ReportUnavailable", "RunData", "load_run", "parse_time", "resolve_run"]

_TAIL_BYTES = 64 * 1024


class ReportUnavailable(Exception):
    """There is no run to report on at the given path; the message says why."""


@dataclass(slots=True)
class ProcessSpan:
    """One rank process as its heartbeat stream saw it: first and last record."""

    rank: int
    pid: int | None
    start: float | None  # epoch seconds
    end: float | None
    last_event: str | None
    exit: JsonObject | None


@dataclass(slots=True)
class RunData:
    """Everything read for one run; empty fields mean the file was missing or unusable."""

    run_id: str
    heartbeat_dir: Path | None = None
    perf_dir: Path | None = None
    status: JsonObject | None = None
    findings: list[Finding] = field(default_factory=list)  # through Finding.from_dict
    restarts: list[RestartEntry] = field(default_factory=list)  # process and in-process
    perf_ranks: list[JsonObject] = field(default_factory=list)
    perf_entries: list[JsonObject] = field(default_factory=list)
    perf_summary: JsonObject | None = None
    gpu_health: dict[int, JsonObject] = field(default_factory=dict)
    launchers: dict[int, JsonObject] = field(default_factory=dict)
    processes: list[ProcessSpan] = field(default_factory=list)
    goodput: Ledger | None = None  # the goodput ledger (rank 0's heartbeat files)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def doc(self) -> StatusDoc:
        """``status.json`` typed (an empty one when it was missing)."""
        return StatusDoc.from_dict(self.status or {})

    @property
    def has_perf(self) -> bool:
        return bool(self.perf_entries or self.perf_summary)

    @property
    def has_heartbeat(self) -> bool:
        return bool(self.status or self.findings or self.perf_ranks or self.processes)


def parse_time(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 string, or ``None`` when it is not one."""
    return iso_epoch_s(value)


# --------------------------------------------------------------------------- finding the run


def _kind(path: Path) -> str | None:
    """``heartbeat`` or ``perf`` when ``path`` holds that kind of run file, else ``None``."""
    try:
        names = [p.name for p in path.iterdir() if p.is_file()]
    except OSError:
        return None
    hb = {STATUS_FILE, FINDINGS_FILE, PERF_RANKS_FILE}
    if any(n in hb or HEALTH_FILE_RE.match(n) or HEARTBEAT_FILE_RE.match(n) for n in names):
        return "heartbeat"
    if any(n == PERF_LOG_FILE or fnmatchcase(n, PERF_SUMMARY_GLOB) for n in names):
        return "perf"
    if any(LAUNCHER_FILE_RE.match(n) for n in names):
        return "heartbeat"
    return None


def _newest_mtime(path: Path) -> float:
    try:
        return max([path.stat().st_mtime, *(p.stat().st_mtime for p in path.iterdir())])
    except OSError:  # removed while we looked: rank it last
        return 0.0


def _pair(run_dir: Path, kind: str) -> tuple[Path | None, Path | None]:
    """The heartbeat and perf directories of the run that ``run_dir`` belongs to."""
    log_dir, run_id = run_dir.parent.parent, run_dir.name
    if kind == "heartbeat":
        sibling = log_dir / PERF_ROOT / run_id
        return run_dir, sibling if run_dir.parent.name == HEARTBEAT_ROOT else None
    sibling = log_dir / HEARTBEAT_ROOT / run_id
    return sibling if run_dir.parent.name == PERF_ROOT else None, run_dir


def resolve_run(path: Path) -> tuple[str, Path | None, Path | None, str | None]:
    """``(run_id, heartbeat_dir, perf_dir, note)`` for a run directory or a log directory.

    A log directory (or its ``heartbeat``/``perf_monitor`` folder) gives its most recently
    written run; ``note`` then says which one was picked.
    """
    if not path.exists():
        raise ReportUnavailable(f"no such directory: {path}")
    if not path.is_dir():
        raise ReportUnavailable(f"not a directory: {path}")
    if path.is_symlink():  # heartbeat/latest: the run it names (its perf directory too)
        path = path.resolve()
    kind = _kind(path)
    if kind is not None:
        return (path.name, *_pair(path, kind), None)
    runs: dict[str, tuple[float, Path, str]] = {}  # run id -> (newest mtime, dir, kind)
    for root in (path / HEARTBEAT_ROOT, path / PERF_ROOT, path):
        if not root.is_dir():
            continue
        for child in root.iterdir():
            # heartbeat/latest links to a run listed under its own name
            child_kind = _kind(child) if child.is_dir() and not child.is_symlink() else None
            if child_kind is None:
                continue
            mtime, prev = _newest_mtime(child), runs.get(child.name)
            if prev is not None:  # same run id under heartbeat/ and perf_monitor/
                mtime = max(mtime, prev[0])
                if prev[2] == "heartbeat":
                    child, child_kind = prev[1], prev[2]
            runs[child.name] = (mtime, child, child_kind)
    if not runs:
        raise ReportUnavailable(
            f"nothing to report in {path}: expected a run directory "
            f"<log_dir>/{HEARTBEAT_ROOT}/<run_id>/ or <log_dir>/{PERF_ROOT}/<run_id>/, "
            "or a log directory that contains them"
        )
    run_id, (_, chosen, chosen_kind) = max(runs.items(), key=lambda kv: (kv[1][0], kv[0]))
    note = f"using the newest run {run_id} ({len(runs)} run(s) under {path})"
    return (run_id, *_pair(chosen, chosen_kind), note)


# --------------------------------------------------------------------------- reading files


def _read_json(path: Path, problems: list[str]) -> JsonObject | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(f"Cannot read {path.name}: {exc.strerror or exc}")
        return None
    except (ValueError, RecursionError) as exc:
        problems.append(f"{path.name} is malformed or partially written ({exc})")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path.name} is malformed: expected a JSON object")
        return None
    return obj


def _parse_line(line: str) -> JsonObject | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _read_jsonl(path: Path, problems: list[str]) -> list[JsonObject]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        problems.append(f"Cannot read {path.name}: {exc.strerror or exc}")
        return []
    out: list[JsonObject] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        obj = _parse_line(line)
        if obj is None:
            bad += 1
        else:
            out.append(obj)
    if bad:
        problems.append(f"Skipped {bad} malformed line(s) in {path.name}")
    return out


def _first_and_last(path: Path) -> tuple[JsonObject | None, JsonObject | None]:
    """First and last valid records of a JSON-lines file, reading only its ends."""
    with open(path, "rb") as fh:
        first = _parse_line(fh.readline().decode("utf-8", errors="replace"))
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - _TAIL_BYTES))
        lines = fh.read().decode("utf-8", errors="replace").splitlines()
    last = next((r for r in map(_parse_line, reversed(lines)) if r is not None), None)
    return first, last


def _process_spans(hb_dir: Path, problems: list[str]) -> list[ProcessSpan]:
    spans: list[ProcessSpan] = []
    names = sorted(os.listdir(hb_dir)) if hb_dir.is_dir() else []
    for path in (hb_dir / n for n in names):
        m = HEARTBEAT_FILE_RE.match(path.name)
        if m is None:
            continue
        try:
            first, last = _first_and_last(path)
        except OSError as exc:
            problems.append(f"Cannot read {path.name}: {exc.strerror or exc}")
            continue
        if first is None or last is None:
            problems.append(f"{path.name} has no valid record")
            continue
        start, end = first.get("wall_time_ns"), last.get("wall_time_ns")
        exit_info = last.get("exit")
        spans.append(
            ProcessSpan(
                rank=int(m.group(1)),
                pid=int(m.group(2)),
                start=ns_epoch_s(start),
                end=ns_epoch_s(end),
                last_event=as_str(last.get("event")),
                exit=exit_info if isinstance(exit_info, dict) else None,
            )
        )
    return spans


def _numbered(
    directory: Path, pattern: re.Pattern[str], problems: list[str]
) -> dict[int, JsonObject]:
    out: dict[int, JsonObject] = {}
    for path in sorted(directory.iterdir()):
        m = pattern.match(path.name)
        if m is not None:
            obj = _read_json(path, problems)
            if obj is not None:
                out[int(m.group(1))] = obj
    return out


def _load_heartbeat(data: RunData, hb: Path) -> None:
    p = data.problems
    data.status = _read_json(hb / STATUS_FILE, p)
    if data.status is None and not (hb / STATUS_FILE).exists():
        data.missing.append(f"No {STATUS_FILE}: the per-rank status table is not available")
    lines, where = _read_jsonl(hb / FINDINGS_FILE, p), FINDINGS_FILE
    if not lines and data.status:
        lines, where = data.doc.recent_findings, STATUS_FILE
    data.findings, bad = parse_findings(lines)
    if bad:
        p.append(f"{where}: {bad} finding(s) not readable as findings (skipped)")
    if (hb / RESTARTS_FILE).exists():
        # a stop decision is a line there too, but no restart (ft.policy)
        restarts = _read_jsonl(hb / RESTARTS_FILE, p)
        entries = (RestartEntry.from_dict(r) for r in restarts)
        data.restarts = [r for r in entries if r is not None and r.kind != STOP_KIND]
    data.perf_ranks = _read_jsonl(hb / PERF_RANKS_FILE, p)
    if not data.perf_ranks:
        data.missing.append(f"No {PERF_RANKS_FILE}: cross-rank step times are not available")
    data.gpu_health = _numbered(hb, HEALTH_FILE_RE, p)
    data.launchers = _numbered(hb, LAUNCHER_FILE_RE, p)
    data.processes = _process_spans(hb, p)
    try:
        data.goodput = read_ledger(hb)
    except OSError as exc:
        p.append(f"the goodput ledger could not be read: {exc}")


def _load_perf(data: RunData, perf: Path) -> None:
    p = data.problems
    data.perf_entries = [e for e in _read_jsonl(perf / PERF_LOG_FILE, p) if e.get("rank", 0) == 0]
    summaries = sorted(perf.glob(PERF_SUMMARY_GLOB))
    if summaries:
        data.perf_summary = _read_json(summaries[-1], p)
    if not data.perf_entries and data.perf_summary:
        logs = data.perf_summary.get("iteration_logs")
        data.perf_entries = [e for e in as_list(logs) if isinstance(e, dict)]
    if not data.perf_entries and not data.perf_summary:
        data.missing.append(f"Perf data is missing: no {PERF_LOG_FILE} or perf summary in {perf}")
    elif data.perf_summary is None:
        data.missing.append(
            "No perf summary (the run may not have finished): "
            f"numbers are computed from {PERF_LOG_FILE}"
        )


def load_run(path: Path) -> tuple[RunData, str | None]:
    """Read the run at ``path`` (run or log directory) and a note on which run was picked."""
    run_id, hb, perf, note = resolve_run(Path(path))
    data = RunData(run_id=run_id)
    if hb is not None and hb.is_dir():
        data.heartbeat_dir = hb
        _load_heartbeat(data, hb)
    else:
        data.missing.append(
            "Heartbeat data is missing: no heartbeat/<run_id> directory "
            "(status, findings, cross-rank times and GPU health are not available)"
        )
    if perf is not None and perf.is_dir():
        data.perf_dir = perf
        _load_perf(data, perf)
    else:
        data.missing.append(
            f"Perf data is missing: no {PERF_ROOT}/{run_id} directory "
            "(rank 0's step time, throughput, TFLOP/s and memory are not available)"
        )
    return data, note
