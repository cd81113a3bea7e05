"""The launcher's verdict on a failed run agrees with the findings, and torchrun's
failure summary is torch elastic's own block."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from rankguard.ft.failure import WorkerFailure
from rankguard.launcher.verdict import failure_summary, root_cause_lines

PEER = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


def root(rank: int, code: int = 1, signal: str | None = None, error: str = "boom") -> WorkerFailure:
    return WorkerFailure(
        rank=rank, local_rank=rank, pid=100 + rank, exit_code=code, signal=signal, error=error
    )


def finding(ftype: str, rank: int, message: str, **exit_info: Any) -> dict[str, Any]:
    return {
        "finding_type": ftype,
        "rank": rank,
        "pid": 100 + rank,
        "hostname": "h",
        "message": message,
        "exit": exit_info or None,
    }


HANG = finding("gpu_progress_timeout", 1, "rank 1 (pid 101 on h): alive but no step for 4.1s > 4s")


def test_a_kill_by_fault_tolerance_is_not_the_cause_the_finding_is() -> None:
    lines = root_cause_lines(root(1, -9, "SIGKILL", "Signal 9 (SIGKILL)"), HANG, [HANG])
    assert lines[0] == (
        "root cause: rank 1 (pid 101 on h): gpu_progress_timeout: alive but no step for 4.1s > 4s"
    )
    assert "exit code -9 (SIGKILL) is fault tolerance's kill" in lines[1]
    lines = root_cause_lines(root(0, error=PEER), HANG, [HANG])  # node 0, culprit elsewhere
    assert lines[1].startswith("  this node's first failed worker, a consequence: rank 0")


def test_the_monitors_first_failure_on_another_node_is_the_cause() -> None:
    """Node 0's own rank died of its peer's end; the monitor saw rank 3 die first."""
    died = finding("rank_process_exited", 3, "rank 3 (pid 103 on h): process vanished")
    warn = finding("straggler_detected", 0, "rank 0 is slow")
    lines = root_cause_lines(root(0, error=PEER), None, [warn, died])
    assert lines[0] == "root cause: rank 3 (pid 103 on h): rank_process_exited: process vanished"
    assert "this node's first failed worker, a consequence: rank 0" in lines[1]


def test_a_peer_that_left_early_is_named_not_the_echo() -> None:
    echo = finding(
        "rank_process_exited", 0, "rank 0: exited with an error", error=PEER, peers_ended_first=[1]
    )
    (line,) = root_cause_lines(root(0, error=PEER), None, [echo])
    assert line.startswith("root cause: rank 1 left the job early")
    assert "rank 0 then failed: " + PEER in line


def test_an_echo_alone_is_not_called_a_root_cause() -> None:
    echo = finding("rank_process_exited", 0, "rank 0: exited with an error", error=PEER)
    (line,) = root_cause_lines(root(0, error=PEER), None, [echo])
    assert line.startswith("root cause: not found: rank 0 (pid 100) exited with code 1")
    (line,) = root_cause_lines(root(0, error=PEER), None, [], monitored=False)
    assert line.startswith("root cause: not on this node: rank 0")


def test_the_agents_own_failure_when_the_findings_agree() -> None:
    raised = finding("rank_process_exited", 1, "rank 1: exited with an error", error="ValueError")
    lines = root_cause_lines(root(1, error="Traceback ...\nValueError: bad"), None, [raised])
    assert lines == ["root cause: rank 1 (pid 101) exited with code 1: ValueError: bad"]
    assert root_cause_lines(None, None, []) == []


def test_failure_summary_is_torch_elastics_child_failed_error(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    tb = 'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: bad\n'
    message = {"message": "ValueError: bad", "extraInfo": {"py_callstack": tb, "timestamp": "1"}}
    error_file.write_text(json.dumps({"message": message}))
    failure = ProcessFailure(local_rank=1, pid=101, exitcode=1, error_file=str(error_file))
    text = failure_summary("train.py", {1: failure})
    assert text is not None
    lines = text.splitlines()
    assert lines[0] == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
    assert "train.py FAILED" in lines
    assert "Root Cause (first observed failure):" in lines
    assert "  rank      : 1 (local_rank: 1)" in lines
    assert any(line.startswith("  exitcode  : 1 (pid: 101)") for line in lines)
    assert f"  error_file: {error_file}" in lines
    assert "  ValueError: bad" in lines
    assert failure_summary("train.py", {}) is None


def test_a_stop_on_another_node_is_not_blamed_on_a_rank() -> None:
    lines = root_cause_lines(
        root(0, error=PEER), None, [], stopped="node 1's launcher received SIGTERM"
    )
    assert lines[0] == (
        "root cause: no rank failed: the job was stopped (node 1's launcher received SIGTERM)"
    )
    assert "a consequence: rank 0 (pid 100)" in lines[1]


def test_a_kill_on_node_0s_request_is_not_the_cause_on_node_1() -> None:
    (line,) = root_cause_lines(
        root(3, -9, "SIGKILL", "Signal 9 (SIGKILL)"),
        None,
        [],
        monitored=False,
        killed_on_request=True,
    )
    assert line.startswith("root cause: a finding on node 0 (its findings name it): rank 3")
    assert "fault tolerance killed it on node 0's request" in line
