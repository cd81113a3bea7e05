"""Tier-2 test harness: a job of ranks as threads in the test process (see
``docs/testing.md``)."""

from tests.harness.faults import Fault, FaultInjector, InjectedFault, Killed
from tests.harness.job import FAST, FakeAgent, JobResult, RankContext, RankOutcome, ThreadedJob

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
