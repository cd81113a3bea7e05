"""A rank's side of live recovery in the in-process wrapper: what it reads and writes in
the workers' store (:mod:`.keys`).

The wrapper holds one :class:`LiveLink` per call when the run has standbys (None
otherwise: the wrapper is as it was). A standby waits in :meth:`LiveLink.await_assignment`
until the launcher gives it a rank or the training ranks finish; a survivor asks
:meth:`LiveLink.replacing` before it gives up on a peer that cannot re-enter; the
newcomer's first completed step is written by the watcher thread
(:meth:`LiveLink.flush`), never by the training loop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from rankguard.live.keys import DROPPED, REPLACING, LiveKeys
from rankguard.live.plan import Assignment, Resumed
from rankguard.live.roles import is_standby, standby_ranks
from rankguard.rank.runenv import RunEnv

__all__ = ["AWAITED_EVERY_S", "LiveLink", "bind", "current"]

logger = logging.getLogger(__name__)

_WAIT_S = 0.2  # longest single store wait of a waiting standby
AWAITED_EVERY_S = 0.5
"""A survivor waiting for a missing rank at a barrier says so at most this often."""
_local = threading.local()


class InProcessRestartError(RuntimeError):
    """The in-process restart cannot go on (budget spent, a peer lost, a timeout, no
    copy of the state to continue from): the process ends with this error and the
    launcher's process restart takes over. Raised by the wrapper and by live recovery's
    state restore; ``rankguard.inprocess.InProcessRestartError`` is this class."""


def _no_restarts() -> int:
    return 0


_restart_count: Callable[[], int] = _no_restarts


def count_restarts_with(count: Callable[[], int]) -> None:
    """The wrapper's count of in-process restarts of the call running in a thread (set
    once, by :mod:`rankguard.inprocess.wrapper` when it is imported; until then no call
    is wrapped: 0)."""
    global _restart_count
    _restart_count = count


def restart_count() -> int:
    """In-process restarts so far in the wrapped call running in this thread (0 in its
    first round, and outside a wrapped call)."""
    return _restart_count()


def current() -> LiveLink | None:
    """The link of the wrapped call running in this thread (None outside a wrapped call,
    or in a run without standbys)."""
    return getattr(_local, "live", None)


def bind(link: LiveLink | None) -> LiveLink | None:
    """This thread's link from now on (the wrapper, for its call); the previous one."""
    previous = current()
    _local.live = link
    return previous


class LiveLink:
    """One wrapped call's live-recovery state (see the module doc)."""

    def __init__(self, keys: LiveKeys, *, standby: bool, pid: int | None = None) -> None:
        self.keys = keys
        self.standby = standby
        self.pid = pid if pid is not None else os.getpid()
        self.store: Any = None
        self.assignment: Assignment | None = None  # this process took a rank
        self.newcomers: list[int] = []  # ranks that joined this round as newcomers
        self.declared = False
        self.current_round = 0  # the wrapper's round (set at each join)
        self.synced_round = -1
        self.received = False  # a newcomer that got a survivor's state (live_state)
        self.shrink = False  # inprocess_restart.shrink_when_no_standby (said at declare)
        self.shrunk_round = -1  # the round that first ran without a dropped rank
        self.dropped_pids: list[int] = []  # the lost processes that round went on without
        self._resumed: Resumed | None = None
        self._resumed_for: tuple[int, ...] = ()  # the pids its record is written under
        self._awaited: dict[int, float] = {}  # rank -> when this rank last said it waits
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: RunEnv, environ: Mapping[str, str] | None = None) -> LiveLink | None:
        """The call's link when the run has standbys (else None)."""
        environ = os.environ if environ is None else environ
        if standby_ranks(environ) == 0:
            return None
        run = env.run_id or env.elastic_run_id or "local"
        return cls(LiveKeys(run, env.restart_count), standby=is_standby(environ))

    @property
    def newcomer(self) -> bool:
        return self.assignment is not None

    @property
    def awaits_state(self) -> bool:
        """A newcomer that has not received a survivor's state yet. Once it has, it
        holds the state like any survivor: when the ranks it got it from are lost in
        turn, it is a source for the next newcomer."""
        return self.newcomer and not self.received

    # ---- a standby ----------------------------------------------------------------

    def await_assignment(self, store: Any, stopped: Callable[[], bool]) -> Assignment | None:
        """Wait for a rank (the assignment) or the end of training (None)."""
        mine, done = self.keys.assign(self.pid), self.keys.finished
        # at the wait: the launcher lets it leave by itself at the end (a standby still
        # starting is ended at once then: it holds nothing yet)
        store.set(self.keys.waiting(self.pid), "1")
        while not stopped():
            try:
                store.wait([mine], timedelta(seconds=_WAIT_S))
            except Exception:  # the chunk timed out
                if store.check([done]):
                    return None
                continue
            self.assignment = Assignment.from_json(store.get(mine))
            return self.assignment
        return None

    # ---- every rank -----------------------------------------------------------------

    def declare(self, *, sharded: bool = False) -> None:
        """The script declared its state: a standby can take a lost rank's place.
        ``sharded``: through the checkpoint manager; such a job does not go on with
        fewer ranks (its local shards load only with the world size that wrote them)."""
        if self.declared or self.store is None:
            return
        if self.shrink and sharded:
            logger.warning(
                "rankguard: inprocess_restart.shrink_when_no_standby has no effect for "
                "sharded state (live_state(checkpoint=...)): a rank lost with no standby "
                "left restarts the worker group"
            )
        elif self.shrink:  # before declared: the launcher reads declared first
            self.store.set(self.keys.shrink, "1")
        self.store.set(self.keys.declared, "1")
        self.declared = True

    def dropped(self, store: Any, rank: int) -> int | None:
        """The lost pid when the launcher dropped ``rank`` (no standby left: the job
        goes on without it), else None. Asked for a rank missing at a barrier."""
        key = self.keys.lost(rank)
        if not store.check([key]):
            return None
        word, _, pid = bytes(store.get(key)[:64]).decode(errors="replace").partition(" ")
        if word != DROPPED:
            return None
        try:
            return int(pid)
        except ValueError:
            return -1

    def replacing(self, store: Any, rank: int) -> bool:
        """Is a standby on its way to take ``rank``'s place? Asked by a survivor while
        ``rank`` is missing at a round's barrier: that wait is said in the store too
        (``awaited/<rank>``, at most every ``AWAITED_EVERY_S``, at a re-entry: not at the
        first round, where a rank may still be starting), evidence for node 0 that a
        silent node's ranks are gone with it (:func:`~rankguard.live.plan.lost_nodes`)."""
        now = time.time()
        last = self._awaited.get(rank, float("-inf"))
        if self.current_round >= 1 and now - last >= AWAITED_EVERY_S:  # a re-entry only
            self._awaited[rank] = now
            store.set(self.keys.awaited(rank), f"{now:.3f}")
        key = self.keys.lost(rank)
        if not store.check([key]):
            return False
        return bytes(store.get(key)[:64]).decode(errors="replace") == REPLACING

    def finish(self, store: Any) -> None:
        """The training ranks completed: the standbys leave."""
        store.set(self.keys.finished, "1")

    def note_resumed(
        self,
        step: int,
        steps_redone: int,
        *,
        pids: tuple[int, ...] = (),
        source: str | None = None,
    ) -> None:
        """The newcomer completed its first step (called from the optimizer's hook: no
        I/O here, the watcher writes it). ``pids``: after a shrink, the first step of
        the smaller world, recorded under the dropped processes' pids instead;
        ``source``: where the newcomer's state came from."""
        with self._lock:
            if self._resumed is None:
                self._resumed = Resumed(
                    t=time.time(), step=step, steps_redone=steps_redone, source=source
                )
                self._resumed_for = pids

    def flush(self, store: Any) -> None:
        """Write the newcomer's first completed step (the watcher thread)."""
        with self._lock:
            resumed, self._resumed = self._resumed, None
            pids, self._resumed_for = self._resumed_for, ()
        if resumed is None:
            return
        for pid in pids:
            store.set(self.keys.resumed(pid), resumed.to_json())
        if not pids and self.newcomer:
            store.set(self.keys.resumed(self.pid), resumed.to_json())
