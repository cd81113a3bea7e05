"""Rank side: where the rank stands in its collectives, sampled off the training thread.

A daemon thread (``rankguard-collectives``) reads the flight recorder's group status
every ``period_s`` (50 ms): ``_dump_fr_trace_json(includeCollectives=False,
onlyActive=True)``, a few hundred bytes, about 3 us on a CPU (the entries are not
dumped), and NCCL's own recorder's the same way where torch has NCCL (the two read as
one, :mod:`.recorders`). Each look updates the rank's
:class:`~rankguard.schema.collectives.CollectivesBlock`
(newest enqueued and completed collective per group, at most 16 groups) and counts
whether the rank was inside a collective; the heartbeat thread publishes the latest
block with each record. The training thread does nothing for it: torch records each
collective in its flight recorder anyway (``rankguard run`` turns the recorder on).

A rank that stays at the same position inside a collective for :data:`STUCK_AFTER_S`
takes one full dump of its recorder (on this thread, once per such position: about
0.1 s with 2,000 entries) to name that collective (operation, input sizes) in its
block's ``stuck``.

The status is keyed by each group's id on this rank (the order the rank created its
groups in), not by the group: rank 0's group ``1`` may be its data-parallel group and
rank 1's group ``1`` another one. The recorder's entries carry both the id and the
group's name (the same on every rank of the group): the sampler takes one full dump
when an id it has not named yet appears (once per group, when the group's first
collective is enqueued) and publishes each position under its group's name, so node 0
compares a group's ranks with each other and never two groups' numbers.

What node 0 reads from it: the rank behind in the sequence of collectives while its
peers wait in the next one (the culprit of a hang, without Python frames: DDP's
reducer and FSDP's hooks wait in C++), and each rank's share of time waiting in
collectives (the rank that never waits is the one the others wait for: a straggler).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rankguard.ft import recorders
from rankguard.schema.collectives import (
    MAX_GROUPS,
    CollectivesBlock,
    GroupPosition,
    StuckCollective,
)

__all__ = [
    "PERIOD_S",
    "STUCK_AFTER_S",
    "CollectiveSampler",
    "group_names",
    "names_in",
    "parse_status",
    "seq_number",
    "stuck_in",
]

logger = logging.getLogger(__name__)

PERIOD_S = 0.05
STUCK_AFTER_S = 2.0  # at one position inside a collective this long: name it
_MAX_STATUS = 1 << 20  # bytes of a status dump read (a few hundred expected)


def _status_json() -> bytes:
    data = recorders.trace_json(include_collectives=False, only_active=True)
    return b"{}" if data is None else data


def seq_number(value: Any) -> int | None:
    """A sequence number from a flight recorder trace: an int, or a string of one (the
    JSON dump writes them so); None for anything else."""
    if type(value) is int:
        return value
    if isinstance(value, str) and len(value) < 20 and value.lstrip("-").isdigit():
        return int(value)
    return None


def parse_status(data: bytes) -> tuple[GroupPosition, ...]:
    """The groups' positions from a status dump (``pg_status``: last enqueued and
    completed collective per group); groups whose numbers do not read are left out."""
    if len(data) > _MAX_STATUS:
        return ()
    doc = json.loads(data)
    status = doc.get("pg_status") if isinstance(doc, dict) else None
    out: list[GroupPosition] = []
    for name, st in sorted((status if isinstance(status, dict) else {}).items()):
        if not isinstance(st, dict) or len(out) >= MAX_GROUPS or len(str(name)) > 64:
            continue
        enq = seq_number(st.get("last_enqueued_collective"))
        done = seq_number(st.get("last_completed_collective"))
        if enq is not None and done is not None and enq >= -1 and done >= -1:
            out.append(GroupPosition(str(name), enq, done))
    return tuple(out)


def _group_id(value: Any) -> str | None:
    """A group's id in the recorder (its ``pg_status`` key): a number, or the text the
    two recorders' merge gives the generic one's groups (``0:cpu``)."""
    if seq_number(value) is not None:
        return str(value)
    if isinstance(value, str) and 0 < len(value) <= 64:
        return value
    return None


def names_in(doc: Any) -> dict[str, str]:
    """Each group's name by its id on the rank (the key of its ``pg_status``), from the
    entries of a parsed dump: ``pg_id`` -> ``process_group[0]``."""
    entries = doc.get("entries") if isinstance(doc, dict) else None
    out: dict[str, str] = {}
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict):
            continue
        pid, pg = _group_id(e.get("pg_id")), e.get("process_group")
        if pid is None or not isinstance(pg, list) or not pg:
            continue
        name = pg[0]
        if isinstance(name, str) and 0 < len(name) <= 64:
            out[pid] = name
    return out


def group_names(data: bytes) -> dict[str, str]:
    """:func:`names_in` of a full dump (JSON, read as data)."""
    return names_in(json.loads(data))


def _entries_json() -> bytes:
    from rankguard.ft.flightrec import _trace_json

    return _trace_json()


def stuck_in(data: bytes, group: GroupPosition) -> StuckCollective | None:
    """The entry of ``group``'s collective ``group.enqueued`` in a full dump (JSON, read
    as data): its operation and input sizes; None when it is not there."""
    doc = json.loads(data)
    entries = doc.get("entries") if isinstance(doc, dict) else None
    for e in reversed(entries if isinstance(entries, list) else []):
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group")
        name = str(pg[0]) if isinstance(pg, list) and pg else str(e.get("pg_id"))
        if name != group.group or seq_number(e.get("collective_seq_id")) != group.enqueued:
            continue
        op = str(e.get("profiling_name") or "unknown").split(":", 1)[-1][:200]
        sizes = json.dumps(e.get("input_sizes"), separators=(",", ":"))[:200]
        return StuckCollective(group.group, group.enqueued, op, sizes)
    return None


class CollectiveSampler:
    """Samples the rank's collective positions; :meth:`block` is a heartbeat block
    source (None until the rank's first collective)."""

    def __init__(
        self,
        *,
        period_s: float = PERIOD_S,
        status: Callable[[], bytes] = _status_json,
        entries: Callable[[], bytes] = _entries_json,
        stuck_after_s: float = STUCK_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s: must be > 0, got {period_s}")
        self.period_s = period_s
        self._status = status
        self._entries = entries
        self.stuck_after_s = stuck_after_s
        self._clock = clock
        self._since: tuple[tuple[GroupPosition, ...], float] | None = None
        self._stuck: tuple[tuple[GroupPosition, ...], StuckCollective | None] | None = None
        self.full_dumps = 0
        self._names: dict[str, str] = {}  # the status' group id -> the group's name
        self._unnamed: set[str] = set()  # ids no entry named: kept under their id
        self.name_dumps = 0
        self._block: CollectivesBlock | None = None
        self.samples = 0
        self.waiting = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start_if_available(cls) -> CollectiveSampler | None:
        """A started sampler, or None on a torch without the JSON status dump."""
        if not recorders.available():
            return None
        sampler = cls()
        sampler.start()
        return sampler

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankguard-collectives", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except Exception:  # never raised into the rank: counted, logged once
                self.errors += 1
                if self.errors == 1:
                    logger.exception("rankguard: reading the collectives' status failed")

    def sample(self) -> None:
        """One look at the recorder's group status."""
        groups = self._named(parse_status(self._status()))
        if not groups:
            return
        self.samples += 1
        inside = [g for g in groups if g.inside]
        self.waiting += bool(inside)
        self._block = CollectivesBlock(
            groups=groups,
            samples=self.samples,
            waiting=self.waiting,
            stuck=self._stuck_in(groups, inside),
        )

    def _named(self, groups: tuple[GroupPosition, ...]) -> tuple[GroupPosition, ...]:
        """The positions under their groups' names (one full dump when an id appears
        that was not named yet); an id no entry names stays as it is."""
        known = self._names.keys() | self._unnamed
        new = [g.group for g in groups if g.group not in known]
        if new:
            self.name_dumps += 1
            self._names.update(group_names(self._entries()))
            self._unnamed.update(k for k in new if k not in self._names)
        named = (replace(g, group=self._names.get(g.group, g.group)) for g in groups)
        return tuple(sorted(named, key=lambda g: g.group))

    def _stuck_in(
        self, groups: tuple[GroupPosition, ...], inside: list[GroupPosition]
    ) -> StuckCollective | None:
        """The collective the rank has waited in at this same position for
        ``stuck_after_s`` (one full dump per position), else None."""
        now = self._clock()
        if not inside:
            self._since = None
            return None
        if self._since is None or self._since[0] != groups:
            self._since = (groups, now)
            return None
        if now - self._since[1] < self.stuck_after_s:
            return None
        if self._stuck is None or self._stuck[0] != groups:
            self.full_dumps += 1
            self._stuck = (groups, stuck_in(self._entries(), inside[0]))
        return self._stuck[1]

    def block(self) -> CollectivesBlock | None:
        return self._block
