"""rankguard's vocabulary: heartbeat records, findings and rank states, the run layout.

Every part that reads or writes a run's files or the store's keys uses these types and
names; none defines its own copy. Nothing here imports torch.
"""

from rankguard.schema.findings import Finding, FindingInfo, FindingType, Liveness, Progress, Reason
from rankguard.schema.layout import RunLayout, StoreKeys
from rankguard.schema.records import (
    SCHEMA_VERSION,
    Event,
    HeartbeatRecord,
    RecordError,
    supersedes,
)

__all__ = [
    "SCHEMA_VERSION",
    "Event",
    "Finding",
    "FindingInfo",
    "FindingType",
    "HeartbeatRecord",
    "Liveness",
    "Progress",
    "Reason",
    "RecordError",
    "RunLayout",
    "StoreKeys",
    "supersedes",
]
