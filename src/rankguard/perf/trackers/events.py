"""New run events from the run directory, for the trackers (rank 0's perf thread).

Node 0's launcher writes ``findings.jsonl`` and ``restarts.jsonl`` (append-only) and rank
0's checkpoint manager replaces ``checkpoints.json``; rank 0 runs on node 0, so its perf
thread reads them where they are, with no store traffic and nothing on the training
thread. Each poll reads what was appended since the last one (byte offsets, at most
``max_bytes`` a file and a poll: a backlog takes several polls) and the checkpoint file
only when its size or mtime changed; each tier's newly committed step is one event.
Node 0's goodput ledger (``goodput.json``, rewritten at most every 30 s by its monitor)
is read the same way, when it changed: one ``goodput`` event with its ETTR, wall time
and parts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rankguard.schema.coerce import as_int
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import CHECKPOINTS_FILE, FINDINGS_FILE, GOODPUT_FILE, RESTARTS_FILE
from rankguard.util.tailer import JsonlTailer

__all__ = ["RunEvent", "RunEventTail"]

MAX_BYTES = 1 << 20
MAX_CHECKPOINT_FILE = 1 << 20
MAX_GOODPUT_FILE = 16 << 20  # the ledger with every interruption of a long job
_GOODPUT_KEYS = ("final", "ettr", "wall_s", "parts_s")
_CHECKPOINT_KEYS = ("path", "time", "stage_s", "write_s", "total_s")


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event for :meth:`PerfSink.event`."""

    kind: str  # finding, restart, checkpoint, goodput
    step: int | None
    fields: JsonObject


class RunEventTail:
    """Incremental reader of a run directory's findings, restarts, checkpoints and
    goodput ledger."""

    def __init__(self, run_dir: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> None:
        if max_bytes < 4096:
            raise ValueError(f"max_bytes: must be >= 4096, got {max_bytes}")
        self.run_dir = Path(run_dir)
        self._findings = JsonlTailer(self.run_dir / FINDINGS_FILE, max_line=max_bytes)
        self._restarts = JsonlTailer(self.run_dir / RESTARTS_FILE, max_line=max_bytes)
        self._ckpt_stat: tuple[int, int] | None = None
        self._goodput_stat: tuple[int, int] | None = None
        self._committed: dict[str, int] = {}
        self.unreadable = 0  # checkpoint or goodput files that could not be parsed

    def poll(self, last_step: int | None = None) -> list[RunEvent]:
        """Events new since the last poll; ``last_step``: the step of an event that
        names none (a restart)."""
        out = [
            RunEvent("finding", as_int(f.get("iteration")), f)
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
        out += self._goodput(last_step)
        return out

    def _changed(
        self, name: str, seen: tuple[int, int] | None, limit: int
    ) -> tuple[tuple[int, int] | None, JsonObject | None]:
        """The JSON object of ``name`` when its size or mtime is not ``seen``: (stat,
        object); (stat, None) when unchanged, too large or unreadable."""
        try:
            st = os.stat(self.run_dir / name)
        except OSError:
            return seen, None
        stat = (st.st_size, st.st_mtime_ns)
        if stat == seen or st.st_size > limit:
            return seen, None
        try:
            doc = json.loads((self.run_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.unreadable += 1
            return None, None  # a later poll tries again
        return stat, doc if isinstance(doc, dict) else None

    def _goodput(self, last_step: int | None) -> list[RunEvent]:
        self._goodput_stat, doc = self._changed(GOODPUT_FILE, self._goodput_stat, MAX_GOODPUT_FILE)
        if doc is None:
            return []
        return [RunEvent("goodput", last_step, {k: doc.get(k) for k in _GOODPUT_KEYS})]

    def _checkpoints(self) -> list[RunEvent]:
        self._ckpt_stat, doc = self._changed(CHECKPOINTS_FILE, self._ckpt_stat, MAX_CHECKPOINT_FILE)
        if doc is None:
            return []
        committed = doc.get("last_committed") or {}
        last = doc.get("last") or {}
        events = []
        for tier, step in sorted(committed.items() if isinstance(committed, dict) else ()):
            step = as_int(step)
            if step is None or self._committed.get(tier, -1) >= step:
                continue
            self._committed[tier] = step
            info = last.get(tier) if isinstance(last, dict) else None
            fields: JsonObject = {"tier": tier, "step": step}
            if isinstance(info, dict) and as_int(info.get("step")) == step:
                fields.update({k: info[k] for k in _CHECKPOINT_KEYS if k in info})
            events.append(RunEvent("checkpoint", step, fields))
        return events
