"""An in-process job: N ranks as threads, the node's real services, short timeouts.

:class:`ThreadedJob` is what ``rankguard run --standalone`` sets up, without processes:

- one ``TCPStore(port=0)`` on 127.0.0.1; each rank thread its own store client and its
  own ``ProcessGroupGloo`` under the job's prefix (``dist.init_process_group`` once per
  thread cannot work: its group registry is process-wide). Collectives go through
  ``torch.distributed``'s API with the group (``dist.all_reduce(t, group=ctx.pg)``), so
  a rank waiting in one shows ``distributed_c10d.py`` as its innermost frame, as a real
  rank does;
- one :class:`~rankguard.rank.runenv.RunEnv` per rank, built from a dict of the variables
  the launcher sets, and its real :class:`~rankguard.session.Session` from
  :func:`rankguard.bootstrap.session_from_env` with the rank's thread as its training
  thread;
- node 0's real :class:`~rankguard.launcher.services.NodeServices` (the
  :class:`~rankguard.monitor.monitor.JobMonitor` with the evaluators the launcher adds:
  stragglers, the stop agreement, rerun), scanning at the config's interval, stopped
  (final status) when the ranks are done; or, ``stepped=True``, scanning only when the
  test says (:meth:`ThreadedJob.scan`, from the ``drive`` function :meth:`ThreadedJob.run`
  calls on the test's thread while the ranks run);
- a :class:`~tests.harness.faults.FaultInjector` (``job.faults.fail_at(rank, step,
  kind)``) and a fake agent (:class:`FakeAgent`: what the launcher would do on a rank's
  exit, recorded, nothing killed).

Every blocking call is bounded: the store and the groups by ``pg_timeout_s``, the rank
threads by ``timeout_s`` (a thread still alive then fails the test), stalls by the
injector's ``release`` event, set at the end.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rankguard.bootstrap import session_from_env
from rankguard.config import RankguardConfig, dumps_config, load_config
from rankguard.launcher.services import NodeServices
from rankguard.rank.runenv import ELASTIC, ENV, RunEnv
from rankguard.schema.layout import run_dir as layout_run_dir
from rankguard.session import NullSession, Session
from tests.factories import STORE_CONNECT_TIMEOUT, read_jsonl
from tests.harness.faults import FaultInjector, Killed

__all__ = ["FAST", "FakeAgent", "JobResult", "RankContext", "RankOutcome", "ThreadedJob"]

# The e2e tests' FAST settings, scaled to seconds: a fault is found within ~2 s.
FAST = (
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.1",
    "heartbeat.scan_interval_s=0.1",
    "heartbeat.initial_process_timeout_s=10",
    "heartbeat.process_timeout_s=1",
    "heartbeat.initial_progress_timeout_s=10",
    "heartbeat.progress_timeout_s=1",
    "heartbeat.checkpoint_timeout_s=5",
    "perf.autodetect=false",  # global module hooks: one detector per process
)


def busy(cpu_s: float) -> None:
    """Spend ``cpu_s`` of this thread's CPU time (a device's compute, on a CPU rank)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:  # a system call: a little work between two
        for _ in range(200):
            pass


@dataclass
class RankOutcome:
    """How a rank's thread ended: ``value`` returned, or ``error`` (its text), or
    ``killed`` (a ``kill`` fault: no ``process_end``)."""

    rank: int
    value: Any = None
    error: BaseException | None = None
    killed: bool = False

    @property
    def exit_code(self) -> int:
        if self.killed:
            return -9
        if isinstance(self.error, SystemExit):
            code = self.error.code
            return code if isinstance(code, int) else 1
        return 0 if self.error is None else 1


@dataclass
class FakeAgent:
    """The launcher's side of a rank's exit, recorded: the first failed rank is the
    root cause it reports to the monitor (as torch elastic's agent does); nothing is
    killed or restarted."""

    services: NodeServices
    exits: list[RankOutcome] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def rank_exited(self, outcome: RankOutcome) -> None:
        with self._lock:
            self.exits.append(outcome)
            first_failure = outcome.exit_code != 0 and all(
                o.exit_code == 0 for o in self.exits[:-1]
            )
        if first_failure and self.services.monitor is not None:
            self.services.monitor.note_root_cause(outcome.rank, os.getpid())


@dataclass
class RankContext:
    """What a rank's function gets: its rank, session, group, environment."""

    rank: int
    world: int
    session: Session | NullSession
    pg: Any  # a ProcessGroupGloo of this rank's own
    env: RunEnv
    job: ThreadedJob

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Through ``torch.distributed`` (bounded by the group's timeout)."""
        dist.all_reduce(tensor, group=self.pg)
        return tensor

    def at_step(self, step: int) -> None:
        """The fault point of ``step`` (1-based)."""
        session = self.session if isinstance(self.session, Session) else None
        self.job.faults.at_step(self.rank, step, session)

    def train(
        self,
        steps: int,
        *,
        step_s: float = 0.005,
        on_step: Callable[[RankContext, int], None] | None = None,
    ) -> int:
        """A data-parallel loop: the fault point, the compute (``step_s`` of this
        thread's CPU time, times the rank's slowdown, inside ``session.compute()``: what
        the straggler probe measures on a CPU rank), an all-reduce, the step end,
        ``on_step``, and the agreed stop (:meth:`Session.should_stop`). Returns the
        steps done."""
        session = self.session
        done = 0
        for step in range(1, steps + 1):
            self.at_step(step)
            with session.compute():
                busy(step_s * self.job.faults.slowdown(self.rank))
            self.all_reduce(torch.ones(1))
            session.step_end(step)
            done = step
            if on_step is not None:
                on_step(self, step)
            if session.should_stop():
                break
        return done


@dataclass
class JobResult:
    run_dir: Path
    log_dir: Path
    outcomes: list[RankOutcome]
    status: dict[str, Any] | None  # the monitor's final status
    agent: FakeAgent

    @property
    def findings(self) -> list[dict[str, Any]]:
        path = self.run_dir / "findings.jsonl"
        return read_jsonl(path) if path.exists() else []

    def heartbeats(self, rank: int) -> list[dict[str, Any]]:
        (path,) = self.run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl")
        return read_jsonl(path)

    def phases_published(self, rank: int) -> set[str]:
        return {r["phase"] for r in self.heartbeats(rank) if r.get("phase")}

    def values(self) -> list[Any]:
        errors = [o for o in self.outcomes if o.error is not None or o.killed]
        assert not errors, [(o.rank, repr(o.error)) for o in errors]
        return [o.value for o in self.outcomes]

    def assert_healthy(self, phases: set[str]) -> None:
        """No finding, the job completed, every rank back in ``train`` with no active
        finding, and each rank's status row saw at least ``phases``."""
        assert self.findings == []
        status = self.status
        assert status is not None and status["state"] == "completed"
        for row in status["ranks"]:
            assert row["phase"] == "train"
            assert row["active_findings"] == []
            assert phases <= set(row["phases_seen"]), (row["rank"], row["phases_seen"])


class ThreadedJob:
    """A job of ``world`` ranks as threads of this process (see the module)."""

    def __init__(
        self,
        tmp_path: Path,
        world: int = 2,
        *,
        sets: tuple[str, ...] | list[str] = (),
        run_id: str = "tier2",
        pg_timeout_s: float = 1.0,
        timeout_s: float = 60.0,
        stepped: bool = False,
    ) -> None:
        """``sets``: ``--set`` overrides on top of :data:`FAST`. ``pg_timeout_s``: the
        store's and the groups' timeout. ``timeout_s``: the most the ranks may take.
        ``stepped``: the monitor scans only in :meth:`scan` (and when it stops)."""
        self.world = world
        self.run_id = run_id
        self.log_dir = tmp_path
        self.cfg: RankguardConfig = load_config(overrides=[*FAST, f"log_dir={tmp_path}", *sets])
        self.run_dir = layout_run_dir(tmp_path, run_id)
        self.pg_timeout = datetime.timedelta(seconds=pg_timeout_s)
        self.timeout_s = timeout_s
        self.stepped = stepped
        self.faults = FaultInjector()
        self.services: NodeServices | None = None

    def environ(self, rank: int, port: int) -> dict[str, str]:
        """The variables ``rankguard run`` and torch elastic give rank ``rank``."""
        return {
            ENV.LAUNCHER: "1",
            ENV.RUN_ID: self.run_id,
            ENV.RUN_DIR: str(self.run_dir),
            ENV.NODE_RANK: "0",
            ENV.CONFIG: dumps_config(self.cfg),
            ENV.LOG_DIR: str(self.log_dir),
            ENV.JOB: "tier2",
            ELASTIC.RANK: str(rank),
            ELASTIC.LOCAL_RANK: str(rank),
            ELASTIC.WORLD_SIZE: str(self.world),
            ELASTIC.LOCAL_WORLD_SIZE: str(self.world),
            ELASTIC.GROUP_RANK: "0",
            ELASTIC.RESTART_COUNT: "0",
            ELASTIC.MASTER_ADDR: "127.0.0.1",
            ELASTIC.MASTER_PORT: str(port),
        }

    def scan(self) -> list[dict[str, Any]]:
        """One scan of node 0's monitor, now (a ``stepped`` job's): the findings it made."""
        assert self.services is not None and self.services.monitor is not None, "not running"
        return [f.to_dict() for f in self.services.monitor.scan_once()]

    def run(
        self,
        fn: Callable[[RankContext], Any],
        *,
        drive: Callable[[ThreadedJob], None] | None = None,
        end: Callable[[NodeServices], str | None] | None = None,
    ) -> JobResult:
        """Start the node's services, run ``fn(ctx)`` on every rank's thread (and
        ``drive(job)`` on this one, once they started: a ``stepped`` job's scans), then
        stop the services (the final status) and return what happened. ``end``: the
        launcher's word on how the run ended (``JobMonitor.note_end``), from the
        services as the ranks left them."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        services = NodeServices(
            self.cfg, self.run_dir, self.run_id, 0, 1, self.world, scan_thread=not self.stepped
        )
        self.services = services
        agent = FakeAgent(services)
        master = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_CONNECT_TIMEOUT
        )
        master.set_timeout(self.pg_timeout)  # connected: its operations bounded as the ranks'
        outcomes = [RankOutcome(r) for r in range(self.world)]
        services.start()
        threads = [
            threading.Thread(
                target=self._rank,
                args=(r, master.port, fn, outcomes[r], agent),
                name=f"rank-{r}",
                daemon=True,
            )
            for r in range(self.world)
        ]
        status = None
        try:
            for t in threads:
                t.start()
            if drive is not None:
                drive(self)
            deadline = time.monotonic() + self.timeout_s
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            alive = [t.name for t in threads if t.is_alive()]
            assert not alive, f"ranks still running after {self.timeout_s} s: {alive}"
        finally:
            self.faults.release.set()
            for t in threads:
                t.join(5)
            if end is not None and services.monitor is not None:
                services.monitor.note_end(end(services))
            status = services.stop()
        return JobResult(self.run_dir, self.log_dir, outcomes, status, agent)

    def _rank(
        self,
        rank: int,
        port: int,
        fn: Callable[[RankContext], Any],
        outcome: RankOutcome,
        agent: FakeAgent,
    ) -> None:
        try:
            env = RunEnv.from_environ(self.environ(rank, port))
            session = session_from_env(env, training_thread=threading.current_thread())
        except BaseException as exc:  # no session: nothing was published
            outcome.error = exc
            agent.rank_exited(outcome)
            return
        pg = None
        try:
            # connecting may wait on the resolver (tests/factories.py); every operation
            # after it is bounded by the group's timeout
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=STORE_CONNECT_TIMEOUT)
            store.set_timeout(self.pg_timeout)
            prefix = dist.PrefixStore(f"{self.run_id}/", store)
            pg = dist.ProcessGroupGloo(prefix, rank, self.world, self.pg_timeout)
            ctx = RankContext(rank, self.world, session, pg, env, self)
            outcome.value = fn(ctx)
        except Killed:
            outcome.killed = True
        except BaseException as exc:
            outcome.error = exc
        finally:
            if pg is not None and (outcome.killed or outcome.error is not None):
                pg.abort()  # as the process's exit would: its peers' collectives break
        if not outcome.killed:
            exc = outcome.error
            error = None if exc is None else f"{type(exc).__name__}: {exc}"
            session.close(clean=exc is None, exit_code=outcome.exit_code, error=error)
        agent.rank_exited(outcome)
