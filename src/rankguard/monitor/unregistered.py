"""Node 0: features the config turns on that the script never took up, said once.

A config written for another tool turns features on whatever the script does (Megatron
Bridge's ``rerun_state_machine`` and ``inprocess_restart`` sections): the rerun state
machine does something only for a script that calls ``rg.rerun()``, in-process restart
only for a script wrapped with ``rankguard.inprocess.wrap``. Each of them, once taken
up, adds its block to the rank's heartbeats (``rerun``, ``inprocess``); a rank past its
second training step whose heartbeat has neither tells that the script did not take it
up. Said once per feature (a warning line on the launcher's console), after the first
steps of the first ranks seen, and in ``status.json`` (``features``): announced as "on"
at start, the feature would otherwise be believed to act.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonObject

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = ["UnregisteredFeatures"]

logger = logging.getLogger(__name__)

MIN_STEPS = 2  # the script's own set-up (rg.rerun(), inprocess.wrap) is done by then

_LINES = {
    "rerun": (
        "rerun_state_machine on, but the script never calls rg.rerun(): no step is "
        "validated or rerun (exits 16 and 17 never happen)"
    ),
    "inprocess": (
        "inprocess_restart on, but the script is not wrapped (rankguard.inprocess.wrap): "
        "a fault restarts the whole worker group instead of re-entering in the process"
    ),
}


class UnregisteredFeatures:
    """A monitor evaluator (:class:`~rankguard.monitor.api.Evaluator`) for the
    features named in ``features`` (``rerun``, ``inprocess``)."""

    name = "features"

    def __init__(self, features: tuple[str, ...], *, min_steps: int = MIN_STEPS) -> None:
        unknown = set(features) - set(_LINES)
        if unknown:
            raise ValueError(f"features: unknown {sorted(unknown)}; known: {sorted(_LINES)}")
        self.pending = list(features)
        self.min_steps = min_steps
        self.unused: list[str] = []

    def evaluate(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        if not self.pending:
            return []
        past = [
            s.record
            for s in ranks.values()
            if s.record is not None and s.record.progress_seq >= self.min_steps
        ]
        if not past:
            return []
        for feature in self.pending:
            if all(getattr(rec, feature) is None for rec in past):
                self.unused.append(feature)
                logger.warning("rankguard: %s", _LINES[feature])
        self.pending = []
        return []

    def status(self) -> JsonObject | None:
        return {"unused": list(self.unused)} if self.unused else None
