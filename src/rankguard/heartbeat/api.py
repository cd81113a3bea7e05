"""The job monitor's extension points: what plugs into a scan.

A light module (no torch, no monitor): the rank side (``rankguard.agree``) and the
launcher's parts implement these without importing the monitor itself.

- :class:`Evaluator`: a verdict beyond the heartbeat rules, once per scan.
- :class:`FindingSink`: something done with each new finding, before and after it is
  written to ``findings.jsonl``.
- :class:`StatusSource`: fields merged into ``status.json`` at each scan.
- :class:`RemoteSource`: records and health snapshots of other nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from rankguard.schema.findings import Finding

if TYPE_CHECKING:
    from rankguard.heartbeat.rules import RankState

__all__ = ["Evaluator", "FindingSink", "RemoteSource", "StatusSource"]


class RemoteSource(Protocol):
    """Records and health snapshots of other nodes (see :mod:`.relay`). A source may
    also have ``disks() -> {node_rank: DiskState}`` (the nodes' disk states) and
    ``shutdowns() -> {node_rank: reason}`` (nodes whose launcher is stopping their
    workers) and ``root_causes() -> {node_rank: (rank, pid)}`` (what a node's agent
    found from its workers' exit codes), as of the last ``fetch``."""

    def fetch(self) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]: ...

    def nodes_done(self) -> bool: ...


class Evaluator(Protocol):
    """A verdict beyond the heartbeat rules (stragglers; later reruns, preemption).

    Called once per scan, after the rules, with every rank's state; returns its new
    findings. ``status()`` is shown under ``status.json``'s key ``name`` (None: nothing).
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
    timeouts in force, a requested stop)."""

    def status_fields(self) -> dict[str, Any]: ...
