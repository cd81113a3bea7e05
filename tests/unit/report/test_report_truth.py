"""What the report says beside the numbers: no findings is not "all was well" when the
run restarted or was stopped, every restart with its cause in the header, the
iteration's source, a gone launcher's ranks as unknown, the start-up window left out."""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rankguard.report import add_parser, load_run, render_page
from rankguard.report.charts import step_time_chart
from tests.factories import write_jsonl
from tests.factories import write_report_run as write_run

pytestmark = pytest.mark.timeout(30)

KILLED = {
    "schema_version": 1,
    "kind": "process",
    "run_id": "r",
    "restart": 1,
    "wall_time": "2024-11-29T10:55:30.000+00:00",
    "cause": "worker_failed",
    "rank": 1,
    "message": "Signal 9 (SIGKILL) received by PID 9853",
}


def _edit_status(run_dir: Path, **changes: Any) -> None:
    path = run_dir / "status.json"
    status = json.loads(path.read_text())
    status.update(changes)
    path.write_text(json.dumps(status))


def _page(run_dir: Path) -> str:
    data, note = load_run(run_dir)
    return render_page(data, note=note)


def test_no_findings_and_a_restart_says_the_restart_and_its_cause(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, findings=[])
    _edit_status(run_dir, state="completed")
    write_jsonl(run_dir / "restarts.jsonl", [KILLED])
    page = _page(run_dir)
    assert "No findings: every rank stayed alive" not in page
    assert (
        "No findings from the monitor, but the run restarted 1 time(s) (1 of the processes): "
        "worker_failed rank 1: Signal 9 (SIGKILL) received by PID 9853." in page
    )
    assert "1 restart, each with its cause: 1 of the processes, 0 in-process." in page
    header = page.split("</header>")[0]
    assert "1 restart (worker_failed rank 1: Signal 9 (SIGKILL) received by PID 9853)" in header


def test_a_stop_decision_is_not_a_restart(tmp_path: Path) -> None:
    """``restarts.jsonl``'s ``stop`` line (the launcher decided not to restart) is not
    counted as a restart."""
    run_dir = write_run(tmp_path, findings=[])
    _edit_status(run_dir, state="completed")
    stop = {**KILLED, "kind": "stop", "restart": None, "decision": "stop"}
    write_jsonl(run_dir / "restarts.jsonl", [KILLED, stop])
    data, _ = load_run(run_dir)
    assert [r.to_dict() for r in data.restarts] == [KILLED]
    assert "1 restart, each with its cause: 1 of the processes, 0 in-process." in _page(run_dir)


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("completed", "No findings: every rank stayed alive and kept making progress."),
        ("stopped", "No findings until the launcher stopped the run (a signal)"),
        ("running", "No findings (the run&#x27;s last state: running)."),
    ],
)
def test_no_findings_is_said_for_the_runs_state(tmp_path: Path, state: str, said: str) -> None:
    run_dir = write_run(tmp_path, findings=[])
    _edit_status(run_dir, state=state)
    assert said in _page(run_dir)


def test_rank_table_marks_the_iterations_source(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    status = json.loads((run_dir / "status.json").read_text())
    status["ranks"][0]["iteration_source"] = "checkpoint"
    status["ranks"][1]["iteration_source"] = "steps"
    (run_dir / "status.json").write_text(json.dumps(status))
    page = _page(run_dir)
    assert '<td class="num">80+</td>' in page and '<td class="num">80*</td>' in page
    assert "ITER: * steps this process counted" in page


def test_start_up_window_is_not_drawn_as_a_step(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    (perf_file,) = (tmp_path / "perf_monitor").glob("*/perf.jsonl")
    entries = [json.loads(line) for line in perf_file.read_text().splitlines()]
    entries[0].update(step_time_ms=3300.0, gpu_step_time_ms=3300.0, includes_startup=True)
    write_jsonl(perf_file, entries)
    data, _ = load_run(run_dir)
    ticks = {float(t) for t in re.findall(r">([0-9]+(?:\.[0-9]+)?)<", step_time_chart(data))}
    assert max(ticks) < 1000  # the axis is the steps' (about 100 ms), not start-up's 3.3 s


def test_a_gone_launchers_ranks_are_unknown_in_the_report(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    monitor = {"hostname": socket.gethostname(), "pid": int(dead.stdout), "pid_start": 1}
    _edit_status(run_dir, state="running", monitor=monitor)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "r.html"
    args = parser.parse_args(["report", str(run_dir), "-o", str(out)])
    assert args.func(args) == 0
    page = out.read_text()
    assert "Launcher gone (pid" in page  # the page's notice
    assert "unknown (launcher gone; last: running)" in page
    ranks = page.split("<h3>Rank status</h3>")[1].split("</table>")[0]
    assert "progressing" not in ranks and ">alive<" not in ranks


def test_exits_the_launcher_caused_are_said_in_the_rank_table(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, findings=[])
    status = json.loads((run_dir / "status.json").read_text())
    for row, why in zip(
        status["ranks"][:3],
        (
            {"after_shutdown": "SIGTERM"},
            {"after_restart": "restart 1"},
            {"after_failure_of_rank": 3},
        ),
        strict=True,
    ):
        row.update(process_liveness="exited", exit={"clean": False, "exit_code": -15, **why})
    (run_dir / "status.json").write_text(json.dumps(status))
    ranks = _page(run_dir).split("<h3>Rank status</h3>")[1]
    for said in ("code -15 (stopped)", "code -15 (restart)", "code -15 (after rank 3)"):
        assert said in ranks, said
