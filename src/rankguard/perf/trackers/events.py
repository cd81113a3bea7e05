"""New run events from the run directory, for the trackers (rank 0's perf thread).

Node 0's launcher writes ``findings.jsonl`` and ``restarts.jsonl`` (append-only) and rank
0's checkpoint manager replaces ``checkpoints.json``; rank 0 runs on node 0, so its perf
thread reads them where they are, with no store traffic and nothing on the training
thread. Each poll reads what was appended since the last one (byte offsets, at most
``max_bytes`` a file and a poll: a backlog takes several polls) and the checkpoint file
only when its size or mtime changed; each tier's newly committed step is one event.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankguard.heartbeat.tailer import JsonlTailer
from rankguard.schema.layout import CHECKPOINTS_FILE, FINDINGS_FILE, RESTARTS_FILE

__all__ = ["RunEvent", "RunEventTail"]

MAX_BYTES = 1 << 20
MAX_CHECKPOINT_FILE = 1 << 20
_CHECKPOINT_KEYS = ("path", "time", "stage_s", "write_s", "total_s")


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event for :meth:`PerfSink.event`."""

    kind: str  # finding, restart, checkpoint
    step: int | None
    fields: dict[str, Any]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RunEventTail:
    """Incremental reader of a run directory's findings, restarts and checkpoints."""

    def __init__(self, run_dir: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> None:
        if max_bytes < 4096:
            raise ValueError(f"max_bytes: must be >= 4096, got {max_bytes}")
        self.run_dir = Path(run_dir)
        self._findings = JsonlTailer(self.run_dir / FINDINGS_FILE, max_line=max_bytes)
        self._restarts = JsonlTailer(self.run_dir / RESTARTS_FILE, max_line=max_bytes)
        self._ckpt_stat: tuple[int, int] | None = None
        self._committed: dict[str, int] = {}
        self.unreadable = 0  # checkpoint files that could not be parsed

    def poll(self, last_step: int | None = None) -> list[RunEvent]:
        """Events new since the last poll; ``last_step``: the step of an event that
        names none (a restart)."""
        out = [
            RunEvent("finding", _int(f.get("iteration")), f)
            for f in self._findings.read()
            if isinstance(f.get("finding_type"), str)
        ]
        out += [
            RunEvent("restart", last_step, r)
            for r in self._restarts.read()
            # a ``stop`` line is the launcher's decision not to restart (ft.policy)
            if (r.get("restart") is not None or r.get("kind")) and r.get("kind") != "stop"
        ]
        out += self._checkpoints()
        return out

    def _checkpoints(self) -> list[RunEvent]:
        path = self.run_dir / CHECKPOINTS_FILE
        try:
            st = os.stat(path)
        except OSError:
            return []
        stat = (st.st_size, st.st_mtime_ns)
        if stat == self._ckpt_stat or st.st_size > MAX_CHECKPOINT_FILE:
            return []
        self._ckpt_stat = stat
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.unreadable += 1
            self._ckpt_stat = None  # a later poll tries again
            return []
        if not isinstance(doc, dict):
            return []
        committed = doc.get("last_committed") or {}
        last = doc.get("last") or {}
        events = []
        for tier, step in sorted(committed.items() if isinstance(committed, dict) else ()):
            step = _int(step)
            if step is None or self._committed.get(tier, -1) >= step:
                continue
            self._committed[tier] = step
            info = last.get(tier) if isinstance(last, dict) else None
            fields = {"tier": tier, "step": step}
            if isinstance(info, dict) and _int(info.get("step")) == step:
                fields.update({k: info[k] for k in _CHECKPOINT_KEYS if k in info})
            events.append(RunEvent("checkpoint", step, fields))
        return events
