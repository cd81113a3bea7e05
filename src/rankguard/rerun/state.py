"""The rerun lifecycle: an explicit state machine that raises on an illegal transition.

::

    IDLE ──► INITIAL_RUN ──► IDLE                          (accepted: checks passed)
                 │
                 └─► RERUN_IN_PLACE ──► IDLE               (transient fault / stats taken)
                          │
                          └─► WILL_RERUN_FROM_CHECKPOINT   (same result: save, exit 16)

    (resumed job)
    IDLE ──► RERUN_FROM_CHECKPOINT ──► IDLE                (same result: skip the batch)
                          └─► STOPPED                      (different: exit 17; same: stop)

``WILL_RERUN_FROM_CHECKPOINT`` and ``STOPPED`` are terminal: the process leaves.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["IllegalTransition", "RerunState", "check_transition"]


class RerunState(str, Enum):
    IDLE = "idle"  # between iterations
    INITIAL_RUN = "initial_run"
    RERUN_IN_PLACE = "rerun_in_place"
    WILL_RERUN_FROM_CHECKPOINT = "will_rerun_from_checkpoint"
    RERUN_FROM_CHECKPOINT = "rerun_from_checkpoint"
    STOPPED = "stopped"


_ALLOWED: dict[RerunState, frozenset[RerunState]] = {
    RerunState.IDLE: frozenset({RerunState.INITIAL_RUN, RerunState.RERUN_FROM_CHECKPOINT}),
    RerunState.INITIAL_RUN: frozenset({RerunState.IDLE, RerunState.RERUN_IN_PLACE}),
    RerunState.RERUN_IN_PLACE: frozenset({RerunState.IDLE, RerunState.WILL_RERUN_FROM_CHECKPOINT}),
    RerunState.WILL_RERUN_FROM_CHECKPOINT: frozenset(),
    RerunState.RERUN_FROM_CHECKPOINT: frozenset({RerunState.IDLE, RerunState.STOPPED}),
    RerunState.STOPPED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """The training loop drove the state machine out of order (a bug in the loop)."""


def check_transition(old: RerunState, new: RerunState) -> RerunState:
    """``new`` if ``old -> new`` is allowed, else :class:`IllegalTransition`."""
    if new not in _ALLOWED[old]:
        raise IllegalTransition(f"rerun state machine: {old.value} -> {new.value} is not allowed")
    return new
