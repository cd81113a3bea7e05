"""The launcher's preemption wiring: one :class:`LaunchPreemption` per ``rankguard run``.

Built when the node gets its number (``preemption.enable_exit_handler``, the node service
of :mod:`.features`): the node's
:class:`~rankguard.preempt.coordinator.PreemptionCoordinator` handed to the agent, the
grace budget checked at start (node 0 says when a save would not fit), node 0's
evaluator added to the monitor. Until the agent starts the workers, the exit signal ends
the launch at once with ``EXIT_PREEMPTED`` (nothing to save yet); from then on the
agent hands it to the coordinator. At the end the outcome is marked preempted and node 0
keeps the longest save for the next run's check.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rankguard.launcher.exitcodes import EXIT_PREEMPTED, JobOutcome
from rankguard.monitor.agree import stop_words
from rankguard.preempt.budget import GraceBudget, load_save_time, store_save_time
from rankguard.preempt.coordinator import PreemptionCoordinator, PreemptionEvaluator
from rankguard.schema import layout

if TYPE_CHECKING:
    from rankguard.config import RankguardConfig
    from rankguard.launcher.agent import RankguardAgent
    from rankguard.launcher.services import NodeServices
    from rankguard.monitor.monitor import JobMonitor

__all__ = ["LaunchPreemption"]


class LaunchPreemption:
    def __init__(
        self,
        cfg: RankguardConfig,
        *,
        node_rank: int,
        nnodes: int,
        run_id: str,
        run_dir: Path,
        services: NodeServices,
        agent: RankguardAgent,
        say: Callable[[str], None],
    ) -> None:
        pre, cadence = cfg.preemption, services.cadence
        self.node_rank = node_rank
        self.say = say
        self.agent = agent
        self.coordinator = PreemptionCoordinator(
            pre,
            node_rank=node_rank,
            nnodes=nnodes,
            run_id=run_id,
            run_dir=run_dir,
            workers=agent.workers,
            store=services.store,
            request_stop=services.request_stop if node_rank == 0 else None,
            ranks=services.rank_states,
            fresh_lead_s=cadence.fresh_lead_s,
            wait_fresh_s=cadence.fresh_wait_s,
            say=say,
        )
        self.finished = services.finished_before_stop  # after the services stopped
        agent.attach_preemption(self.coordinator)
        self.state_path = (
            layout.ft_state_dir(cfg.log_dir, cfg.fault_tolerance.state_dir)
            / layout.PREEMPT_STATE_FILE
        )
        self.budget = GraceBudget(
            pre.preempt_time,
            cadence.agreement_lead_s(services.relaying),
            load_save_time(self.state_path),
        )
        self.evaluator: PreemptionEvaluator | None = None  # node 0's: what was saved
        if node_rank == 0:
            if not self.budget.fits():
                say(self.budget.warning())
            self.evaluator = PreemptionEvaluator(self.coordinator, self.budget, run_id)
            self.add_evaluator(services.monitor)
        if threading.current_thread() is threading.main_thread():
            signal.signal(pre.signum, self._before_workers)

    def _before_workers(self, signum: int, frame: FrameType | None) -> None:
        """The exit signal before the agent took it over (its workers not started)."""
        self.coordinator.claims(signum)
        if not self.agent.workers.pids():
            self.say(
                f"preempted by {signal.Signals(signum).name} before the ranks started: "
                f"nothing to save, exit {EXIT_PREEMPTED}"
            )
            raise SystemExit(EXIT_PREEMPTED)

    def add_evaluator(self, monitor: JobMonitor | None) -> None:
        """Node 0's monitor (built, not yet scanning) runs the preemption's evaluator, if
        this node was node 0 when the coordination was built."""
        if self.evaluator is not None and monitor is not None:
            monitor.add_evaluator(self.evaluator)

    def start(self) -> None:
        self.coordinator.start()

    def stop(self) -> None:
        self.coordinator.stop()

    def finish(self) -> None:
        """After the services stopped: node 0 keeps the longest save for the next run."""
        if self.node_rank == 0:
            store_save_time(self.state_path, self.budget)

    def outcome(self, outcome: JobOutcome) -> JobOutcome:
        """``outcome`` marked preempted when the job was (said on the console); not
        when every rank finished training and exited 0 before the agreed stop step:
        the job completed, a requeue would train again from the last checkpoint."""
        coord = self.coordinator
        if not coord.active:
            return outcome
        evaluator = self.evaluator
        script_step = evaluator.script_step if evaluator is not None else None
        stop = (
            f"stop {stop_words(coord.stop_at, script_step)}"
            if coord.stop_at is not None
            else "no stop step agreed"
        )
        if not coord.terminated and self.finished():
            self.say(
                f"{coord.reason}, but every rank finished training and exited 0 before "
                f"the agreed stop step ({stop}): the job completed, nothing to resume; "
                "not preempted"
            )
            return outcome
        self.say(
            f"preempted ({coord.reason}): {stop}, {self._killed()}; "
            f"exit {EXIT_PREEMPTED}: requeue the job; "
            + (
                self.evaluator.saved_line()
                if self.evaluator is not None
                else "node 0 says what was saved"
            )
        )
        return replace(outcome, preempted=True)

    def _killed(self) -> str:
        """The ranks this node killed at the grace limit: the preemption's root cause
        when there are any (their SIGKILL is rankguard's, not a failure of theirs), each
        with the phase node 0 last saw it in (its save: ``checkpointing``)."""
        coord = self.coordinator
        if not coord.terminated:
            return "no rank killed at the end of the grace window"
        states = coord.ranks() if coord.ranks is not None else {}
        names = []
        for rank in coord.terminated_ranks:
            state = states.get(rank)
            phase = state.record.phase if state is not None and state.record is not None else None
            names.append(f"rank {rank}" + (f" (in its {phase} phase)" if phase else ""))
        who = ", ".join(names) or f"{len(coord.terminated)} rank(s)"
        return (
            f"root cause: {who} had not exited when preempt_time="
            f"{coord.cfg.preempt_time:g}s ran out: rankguard killed it at the grace limit"
        )
