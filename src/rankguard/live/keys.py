"""The names of live recovery's keys in the workers' store (one place: the launcher
writes them, the ranks read them, and the other way round).

Under ``rankguard/live/<run>/<attempt>/``: a new launcher attempt (a group restart)
starts with fresh keys.

- ``declared``: a rank called :func:`~rankguard.live.state.live_state` (its state can
  come from a peer);
- ``assign/<pid>``: the launcher gives the standby with that pid a rank (JSON
  :class:`~rankguard.live.plan.Assignment`);
- ``lost/<rank>``: ``replacing``: a standby is on its way, the survivors wait for it at
  the next round; ``dropped <pid>``: no standby was left and the job goes on without the
  rank (process ``pid`` lost): the survivors form the next round without it;
- ``shrink``: the ranks run with ``inprocess_restart.shrink_when_no_standby`` and
  declared their state (a lost rank with no standby left may be dropped);
- ``waiting/<pid>``: the standby with that pid is at its wait (its start-up and the
  script's set-up done);
- ``finished``: the training ranks completed: the standbys leave;
- ``resumed/<pid>``: the newcomer's first completed step after it took its rank (JSON);
- ``node/<node>``: a node's launcher, refreshed while it watches its workers (JSON
  :class:`~rankguard.live.plan.NodeView`: its standbys waiting, the ranks it holds);
- ``awaited/<rank>``: a survivor waits for that rank at an in-process round's barrier
  (unix seconds, refreshed while it waits);
- ``taken/<node>``: node 0 gave that lost node's ranks to other nodes' standbys (JSON
  :class:`~rankguard.live.plan.Takeover`); ``take/<node>``: the ranks that node's
  standbys take (JSON list);
- ``entry/<node>/<i>``: node ``node``'s ``i``-th recovery (its ``restarts.jsonl`` line,
  JSON), which node 0 writes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DROPPED", "REPLACING", "LiveKeys"]

REPLACING = "replacing"
DROPPED = "dropped"


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
    def shrink(self) -> str:
        return self.prefix + "shrink"

    @property
    def finished(self) -> str:
        return self.prefix + "finished"

    def assign(self, pid: int) -> str:
        return f"{self.prefix}assign/{pid}"

    def lost(self, rank: int) -> str:
        return f"{self.prefix}lost/{rank}"

    def resumed(self, pid: int) -> str:
        return f"{self.prefix}resumed/{pid}"

    def waiting(self, pid: int) -> str:
        return f"{self.prefix}waiting/{pid}"

    def node(self, node: int) -> str:
        return f"{self.prefix}node/{node}"

    def awaited(self, rank: int) -> str:
        return f"{self.prefix}awaited/{rank}"

    def taken(self, node: int) -> str:
        return f"{self.prefix}taken/{node}"

    def take(self, node: int) -> str:
        return f"{self.prefix}take/{node}"

    def entry(self, node: int, i: int) -> str:
        return f"{self.prefix}entry/{node}/{i}"
