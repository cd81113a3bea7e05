"""What a failed attempt left on disk, read for its fingerprint (bounded reads only).

- torch elastic's error file of the failing rank (``@record``): the exception line and
  the traceback (at most 1 MiB; a larger or torn file is ignored);
- the last heartbeat record of each rank of the failed group (the last 64 KiB of
  ``rank_<r>_pid_<p>.heartbeat.jsonl``): the failing rank's phase, iteration and
  ``process_end`` record, and whether any rank made a step in this attempt.

:func:`failure_fingerprint` turns them, with the agent's root cause and the finding the
launcher acted on, into a :class:`~rankguard.ft.fingerprint.Fingerprint`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rankguard.ft.failure import WorkerFailure
from rankguard.ft.fingerprint import Fingerprint
from rankguard.schema.coerce import as_str
from rankguard.schema.findings import FindingType
from rankguard.schema.jsontypes import JsonInput
from rankguard.schema.layout import heartbeat_file_name
from rankguard.schema.records import HeartbeatRecord, RecordError

__all__ = ["AttemptEvidence", "failure_fingerprint", "read_attempt", "read_error_file"]

logger = logging.getLogger(__name__)

MAX_ERROR_FILE = 1 << 20
MAX_TAIL = 64 << 10
_CRASH_FINDINGS = (FindingType.PROCESS_EXITED.value, FindingType.WORKER_FAILED.value)


def read_error_file(path: str | os.PathLike[str] | None) -> tuple[str | None, str | None]:
    """``(message, traceback)`` of a worker's error file; ``(None, None)`` when it is
    missing, too large or not torch elastic's format."""
    if not path:
        return None, None
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_ERROR_FILE + 1)
        if len(data) > MAX_ERROR_FILE:
            return None, None
        doc = json.loads(data)
    except (OSError, ValueError):
        return None, None
    body = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(body, str):
        return body[:4096], None
    if not isinstance(body, dict):
        return None, None
    message = body.get("message")
    info = body.get("extraInfo")
    stack = info.get("py_callstack") if isinstance(info, dict) else None
    return (
        message[:4096] if isinstance(message, str) else None,
        stack[-65536:] if isinstance(stack, str) else None,
    )


def _last_record(path: Path) -> HeartbeatRecord | None:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - MAX_TAIL))
            tail = fh.read(MAX_TAIL)
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            raw = json.loads(line)
            if isinstance(raw, dict):
                return HeartbeatRecord.from_dict(raw)
        except (ValueError, RecordError):
            continue  # a torn last line, or the first line cut by the tail
    return None


@dataclass(frozen=True, slots=True)
class AttemptEvidence:
    """The last heartbeat record of each rank of one attempt (rank -> record)."""

    records: Mapping[int, HeartbeatRecord]

    @property
    def known(self) -> bool:
        return bool(self.records)

    @property
    def before_first_step(self) -> bool | None:
        """No rank made a step in this attempt (None: no record, unknown)."""
        if not self.records:
            return None
        return all(r.progress_seq == 0 for r in self.records.values())

    @property
    def reached(self) -> int | None:
        """The highest iteration a rank reported after a step of this attempt."""
        seen = [
            r.iteration
            for r in self.records.values()
            if r.progress_seq > 0 and r.iteration is not None
        ]
        return max(seen) if seen else None


def read_attempt(run_dir: str | os.PathLike[str], pids: Mapping[int, int]) -> AttemptEvidence:
    """The last records of the ranks ``pids`` (rank -> pid) in ``run_dir``."""
    records = {}
    for rank, pid in pids.items():
        record = _last_record(Path(run_dir) / heartbeat_file_name(rank, pid))
        if record is not None:
            records[rank] = record
    return AttemptEvidence(records)


def failure_fingerprint(
    failure: WorkerFailure, cause: JsonInput | None, attempt: AttemptEvidence
) -> Fingerprint:
    """The fingerprint of a failed attempt: ``failure`` the agent's root cause
    (:func:`rankguard.launcher.agent.first_failure`), ``cause`` the finding the
    launcher acted on, as written (None: none), ``attempt`` the ranks' last records."""
    rank = failure.rank
    record = attempt.records.get(rank)
    message, stack = read_error_file(failure.error_file)
    error = message or failure.error
    exit_info = record.exit if record is not None else None
    if not error and isinstance(exit_info, dict):
        error = as_str(exit_info.get("error"))
    finding = cause.get("finding_type") if cause is not None else None
    if finding in _CRASH_FINDINGS:  # the monitor's or the agent's name of the same crash
        finding = None
    note = cause.get("message") if cause is not None else None
    return Fingerprint.build(
        error=str(error) if error else None,
        callstack=stack,
        exit_code=failure.exit_code,
        signal=failure.signal or None,
        finding_type=str(finding) if finding else None,
        phase=record.phase if record is not None else None,
        iteration=record.iteration if record is not None else None,
        rank=rank,
        before_first_step=attempt.before_first_step,
        note=str(note) if note else None,
    )
