"""The agent's restart-or-stop step: a deterministic start-up failure sets the restart
budget to 0 and writes a stop line; a killed rank's restart carries its decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankguard.ft.decide import RestartDecider
from rankguard.ft.policy import RestartPolicy
from rankguard.schema.restarts import RestartCause

PID = 4242


def agent_in(run_dir: Path, monkeypatch: pytest.MonkeyPatch, exitcode: int, error_file: str) -> Any:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from rankguard.launcher.agent import RankguardAgent

    spec = WorkerSpec(
        role="trainer",
        local_world_size=1,
        entrypoint="python",
        args=(),
        rdzv_handler=object(),
        max_restarts=5,
    )
    lines: list[dict[str, Any]] = []
    restarts: list[RestartCause | None] = []
    policy = RestartPolicy(RestartDecider(), run_dir, "r", lines.append)
    agent = RankguardAgent(
        spec=spec,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir)),
        restart_policy=policy,
        on_restart=lambda n, cause: restarts.append(cause),
    )
    failed = RunResult(
        state=WorkerState.FAILED,
        failures={
            0: ProcessFailure(local_rank=0, pid=PID, exitcode=exitcode, error_file=error_file)
        },
    )
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, wg: failed)
    monkeypatch.setattr(LocalElasticAgent, "_restart_workers", lambda self, wg: None)
    return agent, lines, restarts


class Group:
    state = None
    workers = [type("W", (), {"global_rank": 0, "id": PID})()]


def heartbeat(run_dir: Path, **fields: Any) -> None:
    record = {
        "event": "process_end",
        "run_id": "r",
        "rank": 0,
        "pid": PID,
        "wall_time_ns": 1,
        "progress_seq": 0,
        "phase": "setup",
        **fields,
    }
    (run_dir / f"rank_0_pid_{PID}.heartbeat.jsonl").write_text(json.dumps(record) + "\n")


def test_an_import_error_before_the_first_step_spends_no_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = tmp_path / "error.json"
    stack = (
        'Traceback (most recent call last):\n  File "/home/u/train.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'nope'\n"
    )
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ModuleNotFoundError: No module named 'nope'",
                    "extraInfo": {"py_callstack": stack, "timestamp": "1"},
                }
            }
        )
    )
    heartbeat(tmp_path, exit={"clean": False, "exit_code": 1, "error": "x"})
    agent, lines, _ = agent_in(tmp_path, monkeypatch, 1, str(error_file))
    agent._monitor_workers(Group())
    assert agent._remaining_restarts == 0 and agent.stop_decision is not None
    (line,) = lines
    assert (line["kind"], line["rule"], line["restart"]) == (
        "stop",
        "deterministic_at_startup",
        None,
    )
    assert line["fingerprint"]["frames"] == ["train.py:1:<module>"]
    assert line["fingerprint"]["before_first_step"] is True


def test_a_killed_rank_restarts_with_its_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heartbeat(tmp_path, event="heartbeat", progress_seq=3, iteration=3, phase="train")
    agent, lines, restarts = agent_in(tmp_path, monkeypatch, -9, "")
    agent._monitor_workers(Group())
    assert agent._remaining_restarts == 5 and agent.stop_decision is None and not lines
    agent._restart_workers(Group())
    (cause,) = restarts
    assert cause is not None
    fields = cause.decision
    assert (fields["decision"], fields["rule"]) == ("restart", "transient")
    assert fields["fingerprint"]["signal"] == "SIGKILL"
    assert fields["fingerprint"]["iteration"] == 3
