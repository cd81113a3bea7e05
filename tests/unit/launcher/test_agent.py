"""The agent's root cause (first failure of a failed worker group) and the exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rankguard.ft.failure import WorkerFailure
from rankguard.launcher import exitcodes
from rankguard.launcher.agent import add_peer_errors, first_failure
from rankguard.schema import exits


@dataclass
class FakeFailure:
    """The fields of torch elastic's ProcessFailure that first_failure reads."""

    timestamp: int
    local_rank: int
    pid: int
    exitcode: int
    message: Any = ""
    error_file: str = "<N/A>"

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name if self.exitcode < 0 else "<N/A>"


@dataclass
class FakeResult:
    failures: dict[int, FakeFailure] = field(default_factory=dict)


def test_no_failures_is_none() -> None:
    assert first_failure(FakeResult()) is None
    assert first_failure(FakeResult(failures={})) is None
    assert first_failure(object()) is None  # no failures attribute at all


def test_earliest_error_is_the_root_cause() -> None:
    result = FakeResult(
        failures={
            # Terminated by the agent because another worker failed: a consequence.
            0: FakeFailure(timestamp=50, local_rank=0, pid=101, exitcode=-15, message="Signal 15"),
            3: FakeFailure(
                timestamp=100,
                local_rank=1,
                pid=104,
                exitcode=1,
                message={"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "tb"}},
                error_file="/tmp/err_3.json",
            ),
            2: FakeFailure(timestamp=150, local_rank=0, pid=103, exitcode=1, message="later"),
        }
    )
    out = first_failure(result)
    assert out is not None
    assert out.to_dict() == {
        "finding_type": "worker_failed",
        "rank": 3,
        "local_rank": 1,
        "pid": 104,
        "exit_code": 1,
        "signal": None,  # a plain error exit has no signal
        "error": "RuntimeError: boom",
        "error_file": "/tmp/err_3.json",
    }


def test_rank_killed_by_a_signal_comes_before_errors() -> None:
    # A SIGKILLed rank writes no error file: its timestamp is only when the agent
    # noticed, so it can look later than the errors it caused in its peers.
    result = FakeResult(
        failures={
            0: FakeFailure(timestamp=100, local_rank=0, pid=76, exitcode=1, message="peer gone"),
            1: FakeFailure(timestamp=300, local_rank=1, pid=77, exitcode=-9, message="Signal 9"),
            2: FakeFailure(timestamp=90, local_rank=0, pid=78, exitcode=-15, message="Signal 15"),
        }
    )
    out = first_failure(result)
    assert out is not None
    assert (out.rank, out.exit_code, out.signal) == (1, -9, "SIGKILL")
    assert out.error == "Signal 9"


def test_sigterm_only_is_the_earliest_sigterm() -> None:
    result = FakeResult(
        failures={
            0: FakeFailure(timestamp=20, local_rank=0, pid=5, exitcode=-15, message="t0"),
            1: FakeFailure(timestamp=10, local_rank=1, pid=6, exitcode=-15, message="t1"),
        }
    )
    out = first_failure(result)
    assert out is not None
    assert (out.rank, out.signal) == (1, "SIGTERM")


def test_ties_go_to_the_lowest_rank() -> None:
    result = FakeResult(
        failures={
            4: FakeFailure(timestamp=10, local_rank=0, pid=5, exitcode=1, message="four"),
            2: FakeFailure(timestamp=10, local_rank=0, pid=3, exitcode=1, message="two"),
        }
    )
    out = first_failure(result)
    assert out is not None
    assert (out.rank, out.error) == (2, "two")


def test_message_dict_without_message_uses_the_python_callstack() -> None:
    tb = 'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: x'
    result = FakeResult(
        failures={
            0: FakeFailure(
                timestamp=1,
                local_rank=0,
                pid=9,
                exitcode=1,
                message={"extraInfo": {"py_callstack": tb, "timestamp": "1"}},
            )
        }
    )
    out = first_failure(result)
    assert out is not None
    assert out.error == tb


def test_empty_message_gives_no_error_text() -> None:
    for message in ("", {}, None):
        result = FakeResult(
            failures={0: FakeFailure(timestamp=1, local_rank=0, pid=9, exitcode=2, message=message)}
        )
        out = first_failure(result)
        assert out is not None
        assert out.error is None
        assert out.exit_code == 2


def test_long_error_text_keeps_its_end() -> None:
    text = "start " + "x" * 5000 + " the actual error"
    result = FakeResult(
        failures={0: FakeFailure(timestamp=1, local_rank=0, pid=9, exitcode=1, message=text)}
    )
    out = first_failure(result)
    assert out is not None
    assert len(out.error) == 2000
    assert out.error.endswith(" the actual error")


# ---- exit codes ----------------------------------------------------------------------


def test_retryable_exit_codes() -> None:
    assert {3, 10, 11} <= exitcodes.RETRYABLE
    for code in (0, 1, 2, 12):
        assert code not in exitcodes.RETRYABLE


def test_retryable_matches_the_documented_table() -> None:
    """Every code the module's table says to retry is in RETRYABLE, and only those."""
    doc = exits.__doc__ or ""  # the one table (exitcodes re-exports the codes)
    rows = [line.split("|")[1:-1] for line in doc.splitlines() if line.startswith("| ")]
    documented: dict[int, bool] = {}
    for code, name, _meaning, retry in (cells for cells in rows if len(cells) == 4):
        if code.strip().isdigit():
            value = getattr(exitcodes, name.strip().strip("`"))
            assert value == int(code), name
            documented[value] = retry.strip().startswith("yes")
    assert {0, 1, 2, 3, 10, 11, 12} <= set(documented)
    assert {code for code, retry in documented.items() if retry} == set(exitcodes.RETRYABLE)


def test_exit_code_values() -> None:
    assert (exitcodes.EXIT_OK, exitcodes.EXIT_FAILED, exitcodes.EXIT_USAGE) == (0, 1, 2)
    assert exitcodes.EXIT_UNHEALTHY_GPU == 3
    assert (exitcodes.EXIT_HANG, exitcodes.EXIT_CRASH, exitcodes.EXIT_NO_RESTART) == (10, 11, 12)


# ---- error files: sub-second order, peers of a single reported failure -------------------


def _error_file(path: Path, message: str, timestamp: int, mtime_ns: int) -> str:
    """An error file as torch elastic's ``@record`` writes it."""
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": message,
                    "extraInfo": {
                        "py_callstack": f"Traceback ...\n{message}",
                        "timestamp": str(timestamp),
                    },
                }
            }
        )
    )
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return str(path)


def test_errors_in_the_same_second_are_ordered_by_their_files(tmp_path: Path) -> None:
    # The file's timestamp has whole seconds; the file's mtime tells which came first.
    t = 1_800_000_000
    first = _error_file(tmp_path / "r3.json", "RuntimeError: injected", t, t * 10**9 + 10**6)
    later = _error_file(tmp_path / "r0.json", "RuntimeError: peer closed", t, t * 10**9 + 9 * 10**8)
    result = FakeResult(
        failures={
            0: FakeFailure(timestamp=t, local_rank=0, pid=1, exitcode=1, error_file=later),
            3: FakeFailure(timestamp=t, local_rank=1, pid=2, exitcode=1, error_file=first),
        }
    )
    out = first_failure(result)
    assert out is not None and out.rank == 3


def test_peer_error_files_join_a_single_reported_failure(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    t = 1_800_000_000
    files = {
        0: _error_file(tmp_path / "r0.json", "RuntimeError: peer closed", t, t * 10**9 + 5 * 10**8),
        1: _error_file(tmp_path / "r1.json", "RuntimeError: injected", t, t * 10**9 + 10**8),
        2: str(tmp_path / "r2.json"),  # no file: this rank did not raise
    }
    # torch's multiprocessing context reported rank 0 only (the first it looked at)
    failures: dict[int, Any] = {
        10: ProcessFailure(local_rank=0, pid=100, exitcode=1, error_file=files[0])
    }
    add_peer_errors(failures, files, {0: 100, 1: 101, 2: 102}, lambda lr: 10 + lr)
    assert sorted(failures) == [10, 11]
    assert failures[11].pid == 101 and failures[11].exitcode == 1
    out = first_failure(FakeResult(failures=failures))
    assert out is not None
    assert (out.rank, out.pid, out.error) == (11, 101, "RuntimeError: injected")


def test_peer_error_files_leave_several_failures_alone(tmp_path: Path) -> None:
    t = 1_800_000_000
    files = {lr: _error_file(tmp_path / f"r{lr}.json", f"E{lr}", t, t * 10**9) for lr in range(3)}
    failures: dict[int, Any] = {
        0: FakeFailure(timestamp=t, local_rank=0, pid=1, exitcode=-9),
        1: FakeFailure(timestamp=t, local_rank=1, pid=2, exitcode=1, error_file=files[1]),
    }
    add_peer_errors(failures, files, {}, lambda lr: lr)
    assert sorted(failures) == [0, 1]  # the subprocess path reports every failure itself


def test_workers_get_sigterm_whichever_signal_stopped_the_launcher() -> None:
    from rankguard.launcher.agent import worker_stop_signal

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        assert worker_stop_signal(sig) == signal.SIGTERM
    assert worker_stop_signal(signal.SIGKILL) == signal.SIGKILL  # the agent's own escalation
    assert worker_stop_signal(signal.SIGUSR1) == signal.SIGUSR1


def test_a_signal_stops_the_workers_with_sigterm_and_the_configured_grace(
    tmp_path: Path,
) -> None:
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from rankguard.launcher.agent import RankguardAgent

    spec = WorkerSpec(
        role="trainer", local_world_size=1, entrypoint="python", args=(), rdzv_handler=object()
    )
    agent = RankguardAgent(
        spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)), grace_s=7.4
    )
    closed: list[tuple[signal.Signals, int]] = []

    class FakeContext:
        def close(self, death_sig: signal.Signals, timeout: int) -> None:
            closed.append((death_sig, timeout))

    agent._pcontext = FakeContext()  # type: ignore[assignment]
    # what torch elastic's run() does on SIGHUP: _shutdown(sigval, self._shutdown_timeout)
    agent._shutdown(signal.SIGHUP, timeout=agent._shutdown_timeout)
    assert closed == [(signal.SIGTERM, 7)]


def test_a_withdrawn_cause_restores_the_cause_the_abort_and_the_restart_budget(
    tmp_path: Path,
) -> None:
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from rankguard.launcher.agent import RankguardAgent

    spec = WorkerSpec(
        role="trainer",
        local_world_size=1,
        entrypoint="python",
        args=(),
        rdzv_handler=object(),
        max_restarts=3,
    )
    agent = RankguardAgent(spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)))
    first, aborting = {"finding_type": "a"}, {"finding_type": "b"}
    agent.set_cause(first, abort=False)
    agent.set_cause(aborting, abort=True)
    assert agent.aborted and agent._remaining_restarts == 0
    agent.withdraw_cause(aborting)  # its kill failed: as if it had never been acted on
    assert agent.pending_cause is first
    assert not agent.aborted and agent._remaining_restarts == 3
    agent.withdraw_cause(aborting)  # not the pending cause any more: nothing changes
    assert agent.pending_cause is first


def test_torn_worker_error_files_are_dropped_whole_ones_kept(tmp_path: Path) -> None:
    from rankguard.launcher.agent import drop_torn_error_files

    whole, empty, half = tmp_path / "0.json", tmp_path / "1.json", tmp_path / "2.json"
    whole.write_text(json.dumps({"message": "boom"}))
    empty.write_text("")  # terminated before its first byte
    half.write_text('{"message": {"message": "Runt')
    missing = tmp_path / "3.json"
    files = {0: str(whole), 1: str(empty), 2: str(half), 3: str(missing)}
    assert drop_torn_error_files(files) == [str(empty), str(half)]
    assert whole.exists() and not empty.exists() and not half.exists()


def test_a_torn_error_file_does_not_kill_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A survivor terminated while writing its error file: torch's failure capture raises
    # on parsing it; the agent drops the torn file and looks again.
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from rankguard.launcher.agent import RankguardAgent

    torn = tmp_path / "error.json"
    torn.write_text("")
    spec = WorkerSpec(
        role="trainer", local_world_size=1, entrypoint="python", args=(), rdzv_handler=object()
    )
    agent = RankguardAgent(spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)))

    class Context:
        error_files = {0: str(torn)}

    class Done:
        def is_failed(self) -> bool:
            return False

    agent._pcontext = Context()  # type: ignore[assignment]
    polls: list[str] = []

    def torch_monitor(self: Any, worker_group: Any) -> Done:
        polls.append("poll")  # what torch's poll does with the rank's file
        ProcessFailure(local_rank=0, pid=4242, exitcode=-15, error_file=str(torn))
        return Done()

    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", torch_monitor)
    assert isinstance(agent._monitor_workers(object()), Done)
    assert polls == ["poll", "poll"]  # raised on the torn file, then went through
    assert not torn.exists()


def _failure(exit_code: int, error: str | None) -> WorkerFailure:
    return WorkerFailure(rank=0, local_rank=0, pid=1, exit_code=exit_code, error=error)


def test_rerun_verdicts_end_the_in_job_restarts() -> None:
    from rankguard.launcher.agent import _final_verdict

    assert _final_verdict(_failure(17, None))
    assert _final_verdict(_failure(1, "ReproducibleFaultError: rerun: ..."))
    assert not _final_verdict(_failure(16, None))  # a resume: restart
    assert not _final_verdict(_failure(1, "RuntimeError: boom"))


def test_exit_17_with_exclusion_restarts_the_group_and_names_the_faulty_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad-node exclusion takes exit 17 over: the group restarts (no abort, the budget
    left), and the node whose rank was named faulty leaves at that restart."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from rankguard.ft.config import FaultToleranceConfig
    from rankguard.launcher.agent import RankguardAgent
    from rankguard.launcher.exclusion import NodeExclusion

    def agent_with(run_dir: Path, **ft: Any) -> tuple[RankguardAgent, NodeExclusion]:
        spec = WorkerSpec(
            role="trainer",
            local_world_size=1,
            entrypoint="python",
            args=(),
            rdzv_handler=object(),
            max_restarts=2,
        )
        agent = RankguardAgent(spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(run_dir)))
        ex = NodeExclusion(
            FaultToleranceConfig(**ft), run_id="r", run_dir=run_dir, min_nodes=1, max_nodes=2
        )
        agent.attach_exclusion(ex)
        return agent, ex

    failed = RunResult(
        state=WorkerState.FAILED,
        failures={1: ProcessFailure(local_rank=0, pid=4242, exitcode=17, error_file="")},
    )
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, wg: failed)

    class Group:
        workers = [type("W", (), {"global_rank": 1})()]

    (tmp_path / "rerun_faulty_rank_1.json").write_text('{"rank": 1, "gpu": 0}')
    agent, ex = agent_with(tmp_path, exclude_bad_nodes=True)
    agent._monitor_workers(Group())
    assert not agent.aborted and agent._remaining_restarts == 2
    assert ex.pending is not None and (ex.pending.trigger, ex.pending.gpu) == ("rerun", 0)

    without = tmp_path / "without"
    without.mkdir()
    agent, ex = agent_with(without, exclude_after_restarts=5)  # exclusion, not of GPUs
    agent._monitor_workers(Group())
    assert agent.aborted and agent._remaining_restarts == 0  # 17 ends the job as before


def test_a_forked_ranks_failure_is_logged_without_importing_torch_dynamo() -> None:
    """Forked ranks: torch's multiprocessing context logs a rank's failure with its
    exception, and torch's log formatter imports ``torch._dynamo`` for any record with
    one. The launcher then held it to its exit, whose teardown walked it (0.3-0.4 s of
    CPU after every ``--preload`` job). The traceback goes into the message instead: the
    same lines, nothing imported. In a fresh interpreter (this one may hold it)."""
    code = (
        "import sys\n"
        "from torch.distributed.elastic.multiprocessing.api import MultiprocessContext, logger\n"
        "from rankguard.launcher import agent\n"
        "for _ in range(2):\n"
        "    agent._plain_failure_logging(MultiprocessContext.__new__(MultiprocessContext))\n"
        "try:\n"
        "    raise ValueError('rank 1 raised')\n"
        "except ValueError:\n"
        "    logger.exception('failed (exitcode: %s) local_rank: %s', 1, 1)\n"
        "print('dynamo', 'torch._dynamo' in sys.modules, len(logger.filters))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["dynamo", "False", "1"], res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if "pynvml" not in line]
    said = "\n".join(lines)
    assert "failed (exitcode: 1) local_rank: 1" in said
    assert "Traceback (most recent call last):" in said and "ValueError: rank 1 raised" in said


def test_forked_ranks_get_the_launchers_variables_set_after_the_fork_server_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--preload``: a forked rank's environment is the fork server's (the launcher's
    when it started) plus torch elastic's per-worker variables; what the launcher set or
    changed since is added to each worker's, torch elastic's own values winning."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from rankguard.launcher.agent import RankguardAgent, launcher_env_changes

    monkeypatch.setenv("RG_TEST_CHANGED", "before")
    inherited = dict(os.environ)
    monkeypatch.setenv("RG_TEST_LATE", "late")
    monkeypatch.setenv("RG_TEST_CHANGED", "after")
    assert launcher_env_changes(inherited, os.environ) == {
        "RG_TEST_LATE": "late",
        "RG_TEST_CHANGED": "after",
    }
    spec = WorkerSpec(
        role="trainer", local_world_size=2, entrypoint="python", args=(), rdzv_handler=object()
    )
    logs = DefaultLogsSpecs(log_dir=str(tmp_path))
    forked = RankguardAgent(spec=spec, logs_specs=logs, fork_env=inherited)
    envs = {0: {"RANK": "0"}, 1: {"RANK": "1", "RG_TEST_LATE": "torch elastic's"}}
    forked._setup_local_watchdog(envs)
    assert envs[0] == {"RANK": "0", "RG_TEST_LATE": "late", "RG_TEST_CHANGED": "after"}
    assert envs[1]["RG_TEST_LATE"] == "torch elastic's" and envs[1]["RG_TEST_CHANGED"] == "after"
    # ranks started as new interpreters inherit the launcher's environment: nothing added
    plain = RankguardAgent(spec=spec, logs_specs=logs)
    envs = {0: {"RANK": "0"}}
    plain._setup_local_watchdog(envs)
    assert envs == {0: {"RANK": "0"}}


def test_the_exit_barrier_is_shortened_once_a_lost_nodes_ranks_were_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost agent never reaches torch elastic's exit barrier: the survivors wait
    ``LOST_NODE_EXIT_S``, not ``exit_barrier_timeout``; without a lost node, as set."""
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from rankguard.launcher.agent import LOST_NODE_EXIT_S, RankguardAgent

    waited: list[float] = []
    monkeypatch.setattr(
        SimpleElasticAgent, "_exit_barrier", lambda self: waited.append(self._exit_barrier_timeout)
    )
    spec = WorkerSpec(
        role="trainer", local_world_size=1, entrypoint="python", args=(), rdzv_handler=object()
    )
    live: Any = SimpleNamespace(node_lost=False, on_started=print)
    agent = RankguardAgent(spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)), live=live)
    agent._exit_barrier()
    live.node_lost = True
    agent._exit_barrier()
    assert waited == [300, LOST_NODE_EXIT_S]


def test_a_worker_killed_by_a_signal_is_named_before_torch_stops_its_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch elastic's poll terminates the peers of a failed worker (SIGTERM, then waits)
    # before it returns the failure: the monitor, scanning meanwhile, saw the peers vanish
    # with the killed rank and once named a terminated peer. The agent's own look before
    # that poll names the rank killed by a signal (SIGKILL), not one terminated (SIGTERM).
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    from rankguard.launcher.agent import RankguardAgent

    named: list[Any] = []
    spec = WorkerSpec(
        role="trainer", local_world_size=3, entrypoint="python", args=(), rdzv_handler=object()
    )
    agent = RankguardAgent(
        spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)), on_failure=named.append
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)
    ]
    try:
        context = object.__new__(SubprocessContext)
        context.subprocess_handlers = {r: SimpleNamespace(proc=p) for r, p in enumerate(procs)}  # type: ignore[attr-defined]
        agent._pcontext = context  # type: ignore[assignment]
        group = SimpleNamespace(
            workers=[SimpleNamespace(local_rank=r, global_rank=3 + r) for r in range(3)]
        )
        polls: list[int | None] = []

        def torch_monitor(self: Any, worker_group: Any) -> Any:
            polls.append(procs[1].poll())  # torch's poll reads the same exit code
            return SimpleNamespace(is_failed=lambda: False)

        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", torch_monitor)
        agent._monitor_workers(group)
        assert named == []  # nothing ended: nothing named
        procs[2].terminate()  # a peer terminated (as torch's poll does) ...
        procs[2].wait()
        agent._monitor_workers(group)
        assert named == []  # ... is no cause
        procs[1].kill()
        procs[1].wait()
        agent._monitor_workers(group)
        assert [(c.rank, c.pid, c.exit_code, c.signal) for c in named] == [
            (4, procs[1].pid, -signal.SIGKILL, "SIGKILL")
        ]
        assert polls[-1] == -signal.SIGKILL
    finally:
        for p in procs:
            p.kill()
            p.wait()
