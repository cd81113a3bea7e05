"""What status, the launcher's last line and the report say beside the numbers: the
iteration's source, a gone launcher's rows, exits without a finding, restarts."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from rankguard.cli.status_render import render_status
from rankguard.launcher.console import restart_line, run_end_line, status_line
from rankguard.schema.restarts import RestartEntry
from rankguard.view.statusnotes import (
    exit_note,
    frozen_status,
    iteration_cell,
    iteration_legend,
    restart_cause,
    restarts_summary,
)

pytestmark = pytest.mark.timeout(10)

KILLED = {
    "kind": "process",
    "restart": 1,
    "cause": "worker_failed",
    "rank": 1,
    "message": "Signal 9 (SIGKILL) received by PID 9853",
}


def _row(rank: int, **kw: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "pid": 100 + rank,
        "process_liveness": "alive",
        "gpu_progress": "progressing",
        "iteration": 41,
        "iteration_source": "steps",
        "active_findings": [],
        **kw,
    }


def _status(*rows: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "run_id": "r",
        "state": "running",
        "summary": {
            "ranks_expected": len(rows),
            "process_liveness": {"alive": len(rows)},
            "gpu_progress": {"progressing": len(rows)},
            "findings_total": 0,
            "findings_active": 0,
        },
        "ranks": list(rows),
        **kw,
    }


def test_iteration_cell_marks_what_is_not_the_scripts_numbering() -> None:
    assert iteration_cell({"iteration": 40, "iteration_source": "script"}) == "40"
    assert iteration_cell({"iteration": 41, "iteration_source": "steps"}) == "41*"
    assert iteration_cell({"iteration": 2000, "iteration_source": "checkpoint"}) == "2000+"
    assert iteration_cell({"iteration": 7}) == "7"  # an older writer: no source
    assert iteration_cell({"iteration": None}) == "-"


def test_the_legend_explains_only_the_marks_in_use() -> None:
    assert iteration_legend([{"iteration": 3, "iteration_source": "script"}]) is None
    legend = iteration_legend([_row(0), _row(1, iteration_source="checkpoint")])
    assert legend is not None and legend.startswith("ITER: * steps this process counted")
    assert "+ the resumed checkpoint's step plus the steps since" in legend


def test_status_screen_shows_the_mark_and_the_legend() -> None:
    text = render_status(_status(_row(0), _row(1)), [])
    assert "41*" in text
    assert "ITER: * steps this process counted (optimizer steps" in text


def test_a_gone_launchers_rows_are_unknown_not_alive() -> None:
    status = _status(_row(0), _row(1, process_liveness="exited", gpu_progress="completed"))
    frozen = frozen_status(status)
    assert [r["process_liveness"] for r in frozen["ranks"]] == ["unknown", "exited"]
    assert [r["gpu_progress"] for r in frozen["ranks"]] == ["unknown", "completed"]
    assert frozen["summary"]["process_liveness"] == {"unknown": 2}
    assert frozen["state"] == "unknown (launcher gone; last: running)"
    assert status["ranks"][0]["process_liveness"] == "alive"  # a copy

    gone = "launcher gone (pid 9353 no longer runs: killed?); this status is its last"
    text = render_status(
        _status(_row(0), _row(1)), [], now=datetime.now(timezone.utc), launcher_gone=gone
    )
    table = text.split("\n\n")[1]
    assert "alive" not in text and "progressing" not in text
    assert table.count("unknown") == 4  # liveness and progress of both rows
    assert "liveness unknown=2" in text and gone in text


def test_an_exit_the_launcher_caused_is_said_as_such() -> None:
    assert exit_note({"clean": False, "after_shutdown": "signal 15"}) == "stopped"
    assert exit_note({"clean": False, "after_restart": "restart 1"}) == "restart"
    assert exit_note({"clean": False, "after_failure_of_rank": 1}) == "after rank 1"
    assert exit_note({"clean": False}) is None
    row = _row(
        0,
        process_liveness="exited",
        gpu_progress="unknown",
        exit={"clean": False, "after_shutdown": "signal 15"},
    )
    text = render_status(_status(row, state="stopped"), [])
    assert "exited (stopped)" in text and "exited (err)" not in text


def test_restarts_come_with_their_cause() -> None:
    killed = RestartEntry.from_dict(KILLED)
    assert killed is not None
    assert restart_cause(killed) == "worker_failed rank 1: Signal 9 (SIGKILL) received by PID 9853"
    assert restarts_summary([killed]) == (
        "1 restart (worker_failed rank 1: Signal 9 (SIGKILL) received by PID 9853)"
    )
    hang = replace(killed, restart=2, cause="gpu_progress_timeout", message="stalled")
    assert restarts_summary([killed, hang]) == (
        "2 restarts (worker_failed, gpu_progress_timeout; last: gpu_progress_timeout rank 1:"
        " stalled)"
    )
    assert restarts_summary([]) is None
    assert restart_line(killed) == (
        "restart 1 of the workers: worker_failed rank 1: Signal 9 (SIGKILL) received by PID 9853"
    )
    status = _status(_row(0), restarts=[KILLED])
    assert "restarts 1 restart (worker_failed rank 1" in render_status(status, [])
    assert status_line(status).endswith("findings 0 | restarts 1")
    assert status_line(status).startswith("[running] iter 41-41* | ")  # steps counted


def test_the_launchers_last_line_is_the_runs_state_not_the_monitors() -> None:
    stopped = _status(_row(0), state="stopped", monitor={"state": "scanning"})
    assert run_end_line(stopped) == "run stopped by the launcher: 0 finding(s)"
    done = _status(_row(0), state="completed", restarts=[KILLED])
    assert run_end_line(done) == (
        "run completed: 0 finding(s), 1 restart (worker_failed rank 1: Signal 9 (SIGKILL) "
        "received by PID 9853)"
    )
    dead = _status(_row(0), state="completed", monitor={"state": "stopped", "errors": 2})
    assert "| MONITOR STOPPED (2 failed scan(s)" in run_end_line(dead)
    preempted = _status(_row(0), state="stopped", preemption={"reason": "preempted: ..."})
    assert run_end_line(preempted) == "run stopped: preempted: 0 finding(s)"


def test_a_frozen_status_shows_ages_as_of_now_not_of_its_last_scan() -> None:
    """A launcher gone (or a run ended) an hour ago: a heartbeat 0.0 s old at its last
    scan is an hour old now."""
    now = datetime(2026, 12, 5, 13, 0, 0, tzinfo=timezone.utc)
    rows = (_row(0, heartbeat_age_s=0.0, progress_age_s=1.5), _row(1, heartbeat_age_s=0.2))
    status = _status(*rows, updated_wall_time="2026-12-05T12:00:00.000+00:00")
    gone = "launcher gone (pid 9353 no longer runs: killed?); this status is its last"
    for text in (
        render_status(status, [], now=now, launcher_gone=gone),
        render_status({**status, "state": "failed"}, [], now=now),
    ):
        table = text.split("\n\n")[1]
        assert " 0.0 " not in table and "3600.0" in table and "3601.5" in table, table
    live = render_status(status, [], now=now)  # a running launcher writes it again soon
    assert "3600.0" not in live.split("\n\n")[1]


def test_an_end_after_a_restart_that_never_came_is_not_a_restart() -> None:
    noted = "restart after gpu_progress_timeout on rank 1; no new group started: the job ended"
    assert exit_note({"clean": False, "after_action": noted}) == "no restart"


def test_the_goodput_line_says_the_ettr_and_the_largest_loss() -> None:
    block = {
        "final": False,
        "wall_s": 312.4,
        "ettr": 0.931,
        "productive_s": 290.9,
        "largest_loss": {"part": "startup", "seconds": 11.2},
    }
    screen = render_status(_status(_row(0), goodput=block), [])
    assert (
        "Goodput: ETTR 93.1 % (productive 290.9 s of 312.4 s wall), largest loss startup "
        "11.2 s (so far)"
    ) in screen.splitlines()
    final = {**block, "final": True, "wall_s": 7200.0, "productive_s": 7000.0}
    screen = render_status(_status(_row(0), goodput=final), [])
    assert "(productive 116.7 min of 120.0 min wall), largest loss startup 11.2 s\n" in screen
    for bad in ({"ettr": "x"}, {**block, "wall_s": None}, [1]):
        assert "Goodput" not in render_status(_status(_row(0), goodput=bad), [])
