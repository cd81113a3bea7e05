"""A straggler's agreed stop (``stop_if_detected``) ends every node's launcher with exit
13: node 0 knows the step from its agreement, every other node from the ``control.json``
its ranks read (it exited 0 there, as if the training had completed). Ranks that all
finished training before an agreed stop step (a straggler's or a preemption's) end the
job completed: exit 0."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rankguard.config import load_config
from rankguard.ft.kill import OwnedWorkers
from rankguard.launcher.exitcodes import EXIT_OK, EXIT_PREEMPTED, EXIT_STRAGGLER, exit_code
from rankguard.launcher.preemption import LaunchPreemption
from rankguard.launcher.run import _outcome
from rankguard.monitor.agree import write_control
from rankguard.preempt import PreemptionConfig
from rankguard.preempt.coordinator import PreemptionCoordinator

pytestmark = pytest.mark.timeout(30)


class _Completed:
    def is_failed(self) -> bool:
        return False


def _node_k_outcome(
    run_dir: Path, capsys: pytest.CaptureFixture[str], finished: bool = False
) -> tuple[int, str]:
    services = SimpleNamespace(
        agreement=None, run_dir=run_dir, node_rank=1, finished_before_stop=lambda: finished
    )
    agent = SimpleNamespace(preemption=None)
    outcome = _outcome(_Completed(), None, agent, services, load_config(None), 0)  # type: ignore[arg-type]
    return exit_code(outcome), capsys.readouterr().err


def test_another_node_exits_13_after_a_stragglers_agreed_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_control(tmp_path, 57, "straggler: rank 3 is slow")
    code, said = _node_k_outcome(tmp_path, capsys)
    assert code == EXIT_STRAGGLER
    assert "every rank stopped after 57 training step(s) of this run (stop_if_detected)" in said


def test_without_a_stop_step_another_node_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = _node_k_outcome(tmp_path, capsys)
    assert code == EXIT_OK and "stopped" not in said


def test_ranks_that_finished_before_a_stragglers_stop_step_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank finished its loop and exited 0 before the agreed stop step (or the
    script never asks should_stop()): the job completed, exit 0, not 13."""
    write_control(tmp_path, 57, "straggler: rank 3 is slow")
    code, said = _node_k_outcome(tmp_path, capsys, finished=True)
    assert code == EXIT_OK
    assert (
        "every rank finished training and exited 0 before the agreed stop step (after 57 "
        "training step(s) of this run; straggler: rank 3 is slow): the job completed" in said
    )
    assert "stopped" not in said


def _preemption(tmp_path: Path, said: list[str], finished: bool) -> LaunchPreemption:
    """A node's preemption whose grace window opened, stop step 40 agreed."""
    coord = PreemptionCoordinator(
        PreemptionConfig(enable_exit_handler=True, preempt_time=60),
        node_rank=0,
        nnodes=1,
        run_id="r",
        run_dir=tmp_path,
        workers=OwnedWorkers(),
        say=said.append,
    )
    coord.started_at, coord.reason, coord.stop_at = 1.0, "preempted by SIGTERM", 40
    pre = LaunchPreemption.__new__(LaunchPreemption)
    pre.coordinator, pre.evaluator, pre.say = coord, None, said.append
    pre.finished = lambda: finished
    return pre


@pytest.mark.parametrize("finished", [True, False])
def test_a_preemption_after_the_training_ended_is_a_completed_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finished: bool
) -> None:
    """The signal came, but every rank finished training and exited 0 before the stop
    step: exit 0 (a requeue would train again from the last checkpoint); ranks that
    stopped at it: exit 14."""
    write_control(tmp_path, 40, "preempted by SIGTERM")
    said: list[str] = []
    services = SimpleNamespace(
        agreement=None, run_dir=tmp_path, node_rank=0, finished_before_stop=lambda: finished
    )
    agent = SimpleNamespace(preemption=None)
    outcome = _outcome(_Completed(), None, agent, services, load_config(None), 0)  # type: ignore[arg-type]
    code = exit_code(_preemption(tmp_path, said, finished).outcome(outcome))
    if finished:
        assert code == EXIT_OK
        assert said[-1] == (
            "preempted by SIGTERM, but every rank finished training and exited 0 before the "
            "agreed stop step (stop after 40 training step(s) of this run): the job "
            "completed, nothing to resume; not preempted"
        )
    else:
        assert code == EXIT_PREEMPTED
        assert said[-1].startswith(
            "preempted (preempted by SIGTERM): stop after 40 training step(s) of this run, "
        )
