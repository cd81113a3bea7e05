"""The monitor's verdicts, one small object per verdict (see :mod:`.api`).

Job verdicts, in the order a scan runs them: :class:`NeverSeen` (ranks that never
published), :class:`RankPass` (each rank due: its end, then the rank verdicts),
:class:`StallCulprits` (the culprit of a stall among the stalled ranks). Rank verdicts,
in the order of a rank's turn: :class:`ProcessStale`, :class:`HeartbeatsLate`,
:class:`SectionTimeout`, :class:`ProgressTimeout`, then :class:`GpuHealth` on a live
rank. The evidence they share is in :mod:`.evidence`; how they say what they found in
:mod:`.findings`; which ranks a scan evaluates in :mod:`.due`.
"""

from rankguard.monitor.verdicts.api import Compose, HealthLookup, JobView, RankVerdict, Verdict
from rankguard.monitor.verdicts.due import DueRanks
from rankguard.monitor.verdicts.health import GpuHealth
from rankguard.monitor.verdicts.liveness import HeartbeatsLate, ProcessStale
from rankguard.monitor.verdicts.never_seen import NEVER_SEEN_EACH, NeverSeen
from rankguard.monitor.verdicts.progress import ProgressTimeout
from rankguard.monitor.verdicts.ranks import RankPass, RankVerdicts
from rankguard.monitor.verdicts.sections import SectionTimeout
from rankguard.monitor.verdicts.stalls import StallCulprits

__all__ = [
    "NEVER_SEEN_EACH",
    "Compose",
    "DueRanks",
    "GpuHealth",
    "HealthLookup",
    "HeartbeatsLate",
    "JobView",
    "NeverSeen",
    "ProcessStale",
    "ProgressTimeout",
    "RankPass",
    "RankVerdict",
    "RankVerdicts",
    "SectionTimeout",
    "StallCulprits",
    "Verdict",
]
