"""The monitor's verdicts, one small object per verdict (see :mod:`.api`).

Job verdicts, in the order a scan runs them: :class:`NeverSeen` (ranks that never
published), :class:`RankPass` (each rank due: its verdict), :class:`StallCulprits` (the
culprit of a stall among the stalled ranks). The evidence they share is in
:mod:`.evidence`; how they say what they found in :mod:`.findings`; which ranks a scan
evaluates in :mod:`.due`.
"""

from rankguard.monitor.verdicts.api import Compose, HealthLookup, JobView, RankVerdict, Verdict
from rankguard.monitor.verdicts.due import DueRanks
from rankguard.monitor.verdicts.never_seen import NEVER_SEEN_EACH, NeverSeen
from rankguard.monitor.verdicts.ranks import RankPass
from rankguard.monitor.verdicts.stalls import StallCulprits

__all__ = [
    "NEVER_SEEN_EACH",
    "Compose",
    "DueRanks",
    "HealthLookup",
    "JobView",
    "NeverSeen",
    "RankPass",
    "RankVerdict",
    "StallCulprits",
    "Verdict",
]
