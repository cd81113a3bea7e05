"""The names of live recovery's keys in the workers' store (one place: the launcher
writes them, the ranks read them, and the other way round).

Under ``rankguard/live/<run>/<attempt>/``: a new launcher attempt (a group restart)
starts with fresh keys.

- ``declared``: a rank called :func:`~rankguard.live.state.live_state` (its state can
  come from a peer);
- ``assign/<pid>``: the launcher gives the standby with that pid a rank (JSON
  :class:`~rankguard.live.plan.Assignment`);
- ``lost/<rank>``: ``replacing``: a standby is on its way, the survivors wait for it at
  the next round;
- ``finished``: the training ranks completed: the standbys leave;
- ``resumed/<pid>``: the newcomer's first completed step after it took its rank (JSON);
- ``shrunk/<pid>``: ``shrunk``: the process with that pid was lost, no standby was left
  and the run goes on without it (``inprocess_restart.live_shrink``): the survivors
  re-enter with one rank fewer;
- ``resumed/lost/<pid>``: the first step completed after the shrink that lost that pid
  (JSON, by the shrunk world's rank 0).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REPLACING", "SHRUNK", "LiveKeys"]

REPLACING = "replacing"
SHRUNK = "shrunk"


@dataclass(frozen=True, slots=True)
class LiveKeys:
    run: str
    attempt: int

    @property
    def prefix(self) -> str:
        return f"rankguard/live/{self.run}/{self.attempt}/"

    @property
    def declared(self) -> str:
        return self.prefix + "declared"

    @property
    def finished(self) -> str:
        return self.prefix + "finished"

    def assign(self, pid: int) -> str:
        return f"{self.prefix}assign/{pid}"

    def lost(self, rank: int) -> str:
        return f"{self.prefix}lost/{rank}"

    def resumed(self, pid: int) -> str:
        return f"{self.prefix}resumed/{pid}"

    def shrunk(self, pid: int) -> str:
        return f"{self.prefix}shrunk/{pid}"

    def shrink_resumed(self, lost_pid: int) -> str:
        return f"{self.prefix}resumed/lost/{lost_pid}"
