"""Tier-2 test harness: a job of ranks as threads in the test process; live recovery's
ranks and standbys as processes in :mod:`tests.harness.live` (see ``docs/testing.md``).

The threaded job's names are imported on first use (:func:`__getattr__`): a rank
process of the live harness imports this package too, and the threaded job's modules
(node 0's services, the monitor) cost it a third of a second of CPU it never uses."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.harness.faults import Fault, FaultInjector, InjectedFault, Killed
    from tests.harness.job import (
        FAST,
        FakeAgent,
        JobResult,
        RankContext,
        RankOutcome,
        ThreadedJob,
    )

__all__ = [
    "FAST",
    "FakeAgent",
    "Fault",
    "FaultInjector",
    "InjectedFault",
    "JobResult",
    "Killed",
    "RankContext",
    "RankOutcome",
    "ThreadedJob",
]

_MODULE = {
    **dict.fromkeys(("Fault", "FaultInjector", "InjectedFault", "Killed"), "faults"),
    **dict.fromkeys(
        ("FAST", "FakeAgent", "JobResult", "RankContext", "RankOutcome", "ThreadedJob"), "job"
    ),
}


def __getattr__(name: str) -> Any:
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
