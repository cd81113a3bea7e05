"""The end of a preemption's grace window: the ranks still running are killed by
rankguard, and that kill is the preemption's end, not the job's failure. The job ends
``stopped`` (preempted), its root cause the rank that did not finish in time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.config import load_config
from rankguard.ft.kill import OwnedWorkers
from rankguard.launcher.exitcodes import EXIT_PREEMPTED, exit_code
from rankguard.preempt import PreemptionConfig
from rankguard.preempt.coordinator import PreemptionCoordinator
from tests.factories import heartbeat_record, heartbeat_rules

pytestmark = pytest.mark.timeout(60)


def _expired(tmp_path: Path, said: list[str]) -> PreemptionCoordinator:
    """Node 0's coordinator whose grace window (6 s) opened 10 s ago at stop step 40."""
    coord = PreemptionCoordinator(
        PreemptionConfig(enable_exit_handler=True, preempt_time=6),
        node_rank=0,
        nnodes=1,
        run_id="r",
        run_dir=tmp_path,
        workers=OwnedWorkers(),
        say=said.append,
        clock=lambda: 110.0,
    )
    coord.started_at, coord.reason, coord.stop_at = 100.0, "preempted by SIGTERM", 40
    assert coord.expired()
    return coord


def test_the_agent_says_its_grace_limit_kill_before_it_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monitor hears that rankguard stops the ranks before their deaths reach it:
    a rank killed at the grace limit is held as stopped, not taken for a failure (the
    job ended 'run failed' with SIGKILL as its root cause)."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from rankguard.launcher.agent import RankguardAgent

    events: list[str] = []
    rules = heartbeat_rules(2)  # node 0's monitor, hearing of the shutdown
    rules.ingest(heartbeat_record(0, event="process_end", exit={"clean": True}), 1.0)
    rules.ingest(heartbeat_record(1, pid=os.getpid()), 1.0)

    def note_shutdown(reason: str) -> None:
        events.append(f"shutdown: {reason}")
        rules.note_shutdown(f"launcher received {reason}")

    spec = WorkerSpec(
        role="trainer", local_world_size=2, entrypoint="python", args=(), rdzv_handler=object()
    )
    agent = RankguardAgent(
        spec=spec,
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
        on_signal=note_shutdown,
    )
    said: list[str] = []
    coord = _expired(tmp_path, said)
    agent.attach_preemption(coord)

    class Context:
        def close(self, death_sig: signal.Signals, timeout: int) -> None:
            events.append(f"close {death_sig.name}")

    agent._pcontext = Context()  # type: ignore[assignment]
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # rank 0 left cleanly: not running any more
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        group = SimpleNamespace(
            workers=[
                SimpleNamespace(id=done.pid, global_rank=0),
                SimpleNamespace(id=hung.pid, global_rank=1),
            ]
        )

        def torch_monitor(self: Any, worker_group: Any) -> Any:
            return SimpleNamespace(state=WorkerState.FAILED, failures={})

        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", torch_monitor)
        healthy = SimpleNamespace(state=WorkerState.HEALTHY, failures={})
        agent._preempted_result(group, healthy, coord)
    finally:
        hung.kill()
        hung.wait()
    assert events == [f"shutdown: {coord.kill_reason()}", "close SIGKILL"]
    assert "preempt_time=6s ran out" in events[0]
    assert coord.terminated == [hung.pid] and coord.terminated_ranks == [1]
    assert f"were killed by rankguard at the grace limit (rank(s) 1, pids [{hung.pid}])" in said[-1]
    killed = heartbeat_record(
        1, 2, pid=os.getpid(), event="process_end", exit={"clean": False, "signal": "SIGKILL"}
    )
    rules.ingest(killed, 2.0)
    assert rules.evaluate(2.0) == [] and rules.first_failure is None
    end = rules.ranks[1].record
    assert end is not None and end.exit is not None and "after_shutdown" in end.exit


def test_the_launcher_names_the_killed_rank_as_the_root_cause_not_a_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """torch elastic reports the killed rank as a failure (SIGKILL): the launcher says
    the preemption's end instead, exit 14, no failure summary."""
    from rankguard.launcher.preemption import LaunchPreemption
    from rankguard.launcher.run import _outcome

    said: list[str] = []
    coord = _expired(tmp_path, said)
    rules = heartbeat_rules(2)  # node 0's view: rank 1 was saving
    rules.ingest(heartbeat_record(1, phase="checkpointing"), 1.0)
    coord.ranks = lambda: rules.ranks
    coord.note_terminated([4242], [1])
    failure = SimpleNamespace(pid=4242, exitcode=-9)
    result = SimpleNamespace(is_failed=lambda: True, failures={1: failure})
    agent = SimpleNamespace(preemption=coord)
    cfg = load_config(None)
    outcome = _outcome(result, None, agent, None, cfg, 0, "train.py")  # type: ignore[arg-type]
    assert not outcome.failed and outcome.worker_exit is None
    assert "SIGKILL" not in capsys.readouterr().err  # no torchrun failure summary
    pre = LaunchPreemption.__new__(LaunchPreemption)
    pre.coordinator, pre.evaluator, pre.say = coord, None, said.append
    assert exit_code(pre.outcome(outcome)) == EXIT_PREEMPTED
    assert (
        "stop after 40 training step(s) of this run, root cause: rank 1 (in its checkpointing "
        "phase) had not exited when "
        "preempt_time=6s ran out: rankguard killed it at the grace limit; exit 14" in said[-1]
    )
    # a rank that failed on its own in the window is still the job's failure
    crashed = SimpleNamespace(pid=4343, exitcode=1, local_rank=0, message="boom")
    crashed.signal_name = lambda: "SIGKILL"
    crashed.error_file = None
    from rankguard.launcher.run import _grace_kills_only

    both = SimpleNamespace(is_failed=lambda: True, failures={0: crashed, 1: failure})
    assert not _grace_kills_only(both, agent)  # type: ignore[arg-type]
