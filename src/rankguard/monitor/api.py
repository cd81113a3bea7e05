"""The job monitor's extension points: what plugs into a scan.

A light module (no torch, no monitor): the rank side (``rankguard.monitor.agree``) and the
launcher's parts implement these without importing the monitor itself.

- :class:`Evaluator`: a verdict beyond the heartbeat rules, once per scan.
- :class:`FindingSink`: something done with each new finding, before and after it is
  written to ``findings.jsonl``.
- :class:`StatusSource`: fields merged into ``status.json`` at each scan.
- :class:`RemoteSource`: records and health snapshots of other nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonObject, JsonValue

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.schema.statusblocks import StatusBlock
    from rankguard.util.disk import DiskState

__all__ = ["Evaluator", "FindingSink", "RemoteSource", "StatusFields", "StatusSource"]

StatusFields: TypeAlias = "Mapping[str, StatusBlock | JsonValue]"
"""What a status source or a node service adds to ``status.json``, by key: a typed block
of :mod:`rankguard.schema.statusblocks` (written as its ``to_dict``) or a JSON value."""


class RemoteSource:
    """What other nodes tell node 0's monitor (see :mod:`.relay`): their records and
    health snapshots (:meth:`fetch`), and, as of the last fetch, each node's disk state,
    whether its launcher is stopping its workers, and the root cause its agent found
    from their exit codes. The last three say nothing by default."""

    def fetch(self) -> tuple[list[JsonObject], dict[int, JsonObject]]:
        raise NotImplementedError

    def fetch_changed(self) -> tuple[list[Any], dict[int, JsonObject]]:
        """What changed since the last call (records as dicts or typed records); the
        monitor's call at each scan. By default everything :meth:`fetch` returns."""
        return self.fetch()

    def ignored(self) -> tuple[int, str | None]:
        """Relayed data the source itself could not use: how many, the last reason."""
        return 0, None

    def nodes_done(self) -> bool:
        raise NotImplementedError

    def disks(self) -> dict[int, DiskState]:
        return {}

    def shutdowns(self) -> dict[int, str]:
        return {}

    def root_causes(self) -> dict[int, tuple[int, int | None]]:
        return {}


class Evaluator(Protocol):
    """A verdict beyond the heartbeat rules (stragglers; later reruns, preemption).

    Called once per scan, after the rules, with every rank's state; returns its new
    findings. ``status()`` is shown under ``status.json``'s key ``name`` (None: nothing).
    An evaluator that also has an ``on_record(record)`` method is given every record of
    the job as the scan reads it, not only each rank's latest: for what one record says
    once and a later record of the rank hides before the scan ends (a process killed
    just after it, its replacement's first record read in the same scan). It must not
    raise and only keeps what it needs for ``evaluate``.
    """

    name: str

    def evaluate(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]: ...

    def status(self) -> Any: ...


class FindingSink:
    """Something done with each new finding. ``before_write`` may complete it (the
    action taken, stack dumps) before it reaches ``findings.jsonl``; ``after_write``
    acts on it once its line was appended, or queued when the append failed (a full
    disk must not stop an action). An exception in a sink is logged and counted,
    never lost nor raised into the scan. Both do nothing by default."""

    def before_write(self, finding: Finding) -> None:
        return None

    def after_write(self, finding: Finding) -> None:
        return None


class StatusSource(Protocol):
    """Fields merged into ``status.json`` at each scan (the launcher's restarts, the
    timeouts in force, a requested stop): by key, a typed block of
    :mod:`rankguard.schema.statusblocks` (written as its ``to_dict``) or a JSON value."""

    def status_fields(self) -> StatusFields: ...
