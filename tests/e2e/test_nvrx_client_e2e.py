"""End to end: a script that uses NVRx's RankMonitorClient as Megatron-LM does runs
unchanged under ``rankguard run`` (2 CPU ranks, gloo) with ft_launcher's flags: NVRx's
``ft_state.json`` written by the script, a hang inside the ``step`` section found by that
section's timeout, stacks dumped, the group restarted; the same hang in the restarted
group, with no restart left, ends the job with the hang's exit code and the hang as its
root cause. One launch for both (the hang, its restart, then the hang past the budget),
its ranks and their restart forked from the ``--preload torch`` fork server (each
forked rank imports NVRx's client itself and serves it from its own process). No
finding from a healthy client (NVRx 0.7.0's, in ranks started as new interpreters):
``test_bridge_checks_e2e.py``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rankguard.schema.exits import EXIT_HANG

from .conftest import (
    SCRIPTS,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_rankguard,
    standalone_run,
)

pytest.importorskip("nvidia_resiliency_ext.fault_tolerance")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def _run(
    tmp_path: Path, run_id: str, *script_args: str, ft: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "tmp").mkdir()
    res = subprocess.run(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "--ft-rank_section_timeouts=setup:60,step:4,checkpointing:30",
            "--ft-rank_out_of_section_timeout=30",
            *ft,
            str(SCRIPTS / "megatron_ft.py"),
            "--save",
            str(tmp_path / "save"),
            *script_args,
        ),
        capture_output=True,
        text=True,
        timeout=140,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path / "tmp")},
    )
    return res, tmp_path / "heartbeat" / run_id


def _socket_dirs(tmp_path: Path) -> list[str]:
    """The NVRx socket directories left in the run's $TMPDIR."""
    return sorted(n for n in os.listdir(tmp_path / "tmp") if n.startswith("rg-nvrx-"))


def test_hang_in_the_step_section_is_restarted_then_with_no_restart_left_ends_the_job(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: NVRx's client in each rank process reaches rankguard's server in
    that process through the process's own environment and socket directory (one per
    rank, removed at the end) and gets the section timeouts of the launch's command
    line; the hung rank process's stacks dumped by signal, the process killed and the
    group restarted by the agent (ft_launcher's flags alone turn fault tolerance on;
    its ``--max-restarts``); the restarted group computes its section timeouts into
    NVRx's ``ft_state.json``. Its rank 1 hangs again: with no restart left the rank past
    its section timeout is ended and the job fails by itself, as under ft_launcher (it
    used to be reported and the job hung on until something killed it), with the hang's
    exit code; what a user reads last (the console, status.json, ``rankguard status``)
    names the hang as the root cause, not the SIGKILL fault tolerance sent for it."""
    res, run_dir = _run(
        tmp_path,
        run_id,
        "--iters",
        "30",
        "--calc-ft-timeouts",
        "--hang-rank",
        "1",
        "--hang-iter",
        "12,22",  # the restarted group's after its save at 20 (a step timeout calculated)
        ft=(
            # the ranks and their restart forked from the fork server: their start is not
            # the subject (NVRx 0.7.0's client in new interpreters:
            # test_bridge_checks_e2e)
            "--preload",
            "torch",
            "--max-restarts",
            "1",
            "--set",
            "fault_tolerance.termination_grace_s=3",
            "--set",
            "fault_tolerance.stack_dump=faulthandler",
        ),
    )
    out = res.stdout + res.stderr
    assert res.returncode == EXIT_HANG, out
    (first,) = [line for line in out.splitlines() if line.startswith("[rankguard] monitoring:")]
    assert "fault tolerance on" in first and "restarts 1" in first, first
    assert "rank 1 hangs inside its step at iteration 12" in out, out
    assert "rank 1 hangs inside its step at iteration 22" in out, out
    assert "done: 30 iterations" not in out
    # the client got the launch's section timeouts from rankguard
    assert "'step': 4.0" in out and "out_of_section=30.00" in out, out
    state = json.loads((tmp_path / "save" / "ft_state.json").read_text())
    section = state["current_timeouts"]["section"]
    assert set(section["calculated_sections"]) >= {"step", "checkpointing"}
    assert 0 < section["section"]["step"] < 4.0
    # every rank's heartbeats show the client served (the restarted processes' files)
    for rank in (0, 1):
        hbs = sorted(run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl"))
        assert len(hbs) == 2, (rank, hbs)
        for hb in hbs:
            nvrx = [r["nvrx"] for r in read_jsonl(hb) if "nvrx" in r]
            assert nvrx and nvrx[-1]["section_events"] > 0, (rank, hb)
    # rank 1 alone, each time: rank 0 waits for its gradients in DDP's all-reduce (under
    # autograd's backward), a victim even when its stall crosses the timeout first
    findings = read_jsonl(run_dir / "findings.jsonl")
    assert [(f["finding_type"], f["rank"]) for f in findings] == [
        ("gpu_progress_timeout", 1),
        ("gpu_progress_timeout", 1),
    ], findings
    assert findings[0]["action"] == "restart", findings[0]
    assert findings[0]["timeout_s"] == 4.0, findings[0]  # the step section's timeout
    dump = Path(findings[0]["stack_dump"])
    assert dump.exists() and "megatron_ft.py" in dump.read_text()
    (restart,) = read_jsonl(run_dir / "restarts.jsonl")
    assert restart["cause"] == "gpu_progress_timeout" and restart["rank"] == 1
    assert read_status(run_dir)["state"] == "failed", out
    # the root cause is the hang found, not the SIGKILL fault tolerance sent for it
    lines = [line for line in out.splitlines() if line.startswith("[rankguard] ")]
    i = next(i for i, line in enumerate(lines) if "root cause:" in line)
    assert lines[i].startswith("[rankguard] root cause: rank 1 (pid "), out
    assert "gpu_progress_timeout: alive but no step completed" in lines[i], out
    assert "exit code -9 (SIGKILL) is fault tolerance's kill" in lines[i + 1], out
    shown = run_rankguard(["status", str(run_dir)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    screen = shown.stdout
    assert "launcher gone" not in screen and "killed?" not in screen, screen
    assert "state failed" in screen, screen
    assert no_leftover_workers(run_id)
    # the ranks ended by signals (the culprit's SIGKILL, its peer's SIGTERM): their
    # socket directories went with the launcher's
    assert _socket_dirs(tmp_path) == []
