"""End to end: the exit signal mid-run -> every rank saves one step, the launcher exits
EXIT_PREEMPTED (14), and the relaunched job resumes from that step; a signal to a rank,
a save that hangs past the grace time, a signal before the first step.

Elsewhere: the agreed stop step, a second signal, a signal to node 1 or to a rank alone,
the grace budget, the exit code (``tests/unit/preempt/test_preempt.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rankguard.launcher.exitcodes import EXIT_PREEMPTED
from rankguard.preempt import TorchFileSaver

from .conftest import (
    SCRIPTS,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PREEMPT = ["--set", "preemption.enable_exit_handler=true"]
TRAIN = str(SCRIPTS / "preempt_train.py")


def launch(
    tmp_path: Path, run_id: str, *train: str, nproc: int = 2, extra: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """``extra``: launcher options before the script (``--set``, ``--preload``)."""
    cmd = rankguard_cmd(
        *standalone_run(run_id, tmp_path / "logs", nproc=nproc),
        *PREEMPT,
        *extra,
        TRAIN,
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        *train,
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def events(tmp_path: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(tmp_path / "ckpt" / "events.jsonl") if e["event"] == kind]


def findings(tmp_path: Path, run_id: str) -> list[dict]:
    return read_jsonl(tmp_path / "logs" / "heartbeat" / run_id / "findings.jsonl")


def _rank_steps(tmp_path: Path, rank: int) -> set[int]:
    """The steps rank ``rank``'s ``TorchFileSaver`` holds (what the script resumes from)."""
    return set(TorchFileSaver(tmp_path / "ckpt", rank, dict).steps())


def test_preempt_saves_one_step_exits_14_resumes_and_a_hung_save_is_killed(
    tmp_path: Path, run_id: str
) -> None:
    """Two launches, 2 ranks each. The first: SIGTERM to the launcher during an
    evaluation, a second one during the save; every rank saves the same step, exit 14.
    The relaunch resumes right after it; then the signal goes to rank 1 itself (not the
    launcher) right after a periodic checkpoint: the rank passes it to its launcher and
    the job is preempted as a whole, but rank 1 hangs in the preemption save: killed
    when preempt_time is over, the exit code is still 14 and the previous checkpoint
    (every rank's) is what the next launch resumes. A real launch: SIGTERM to the
    launcher and to a rank process, exit 14, a relaunch, the launcher's kill of a worker
    process at the grace limit. (The agreement across nodes:
    ``tests/unit/preempt/test_preempt.py``.)"""
    # the first launch's ranks forked from its fork server (how they start is not what
    # it shows); the relaunch starts its ranks afresh: its rank 1 is signalled itself
    proc = launch(
        tmp_path,
        run_id,
        "--signal-step",
        "8",
        "--signal-in",
        "eval",
        "--resignal-in-save",
        extra=("--preload", "torch"),
    )
    code, out = finish(proc)
    assert code == EXIT_PREEMPTED, out[-3000:]
    saved = events(tmp_path, "saved")
    assert len(saved) == 2 and len({e["step"] for e in saved}) == 1, saved
    assert all(e["preempted"] for e in saved)
    step = saved[0]["step"]
    assert step > 8
    assert "again: ignored" in out
    found = findings(tmp_path, run_id)
    kinds = [(f["reason"], f.get("iteration")) for f in found]
    assert ("every_rank_saved_the_agreed_step", step) in kinds, kinds
    # nothing else: a healthy job preempted
    assert {f["finding_type"] for f in found} == {"job_preempted"}, found
    # what the launcher says last is true: every rank reported the save of that step
    assert f"every rank saved script step {step}: the next run resumes there" in out, out[-3000:]
    assert "run stopped: preempted" in out
    status = json.loads((tmp_path / "logs" / "heartbeat" / run_id / "status.json").read_text())
    assert status["state"] == "stopped"
    assert no_leftover_workers(run_id)

    run2 = f"{run_id}-2"
    again = launch(
        tmp_path,
        run2,
        "--ckpt-every",
        "5",
        "--step-sleep",
        "0.1",
        "--hang-save-rank",
        "1",
        extra=("--set", "preemption.preempt_time=6"),
    )
    deadline = time.monotonic() + 90
    target = None
    while time.monotonic() < deadline and target is None:
        starts = [e for e in events(tmp_path, "start")[2:] if e["rank"] == 1]
        if starts and max(_rank_steps(tmp_path, 1)) > step:  # a periodic save of this job
            target = starts[0]["pid"]
        time.sleep(0.05)
    assert target is not None, "rank 1 never saved a periodic checkpoint"
    os.kill(target, signal.SIGTERM)
    t0 = time.monotonic()  # the hung save is killed at the grace limit (6 s), not later
    code, out = finish(again)
    assert code == EXIT_PREEMPTED, out[-3000:]
    starts = [e["start"] for e in events(tmp_path, "start")[2:]]
    assert starts == [step + 1, step + 1]  # resumed right after the agreed step
    assert "were killed" in out
    assert time.monotonic() - t0 < 60
    saved = events(tmp_path, "saved")[2:]
    assert [(e["rank"], e["preempted"]) for e in saved] == [(0, True)], saved
    common = saved[0]["step"] // 5 * 5  # the last periodic save of both ranks
    assert common > step
    both = _rank_steps(tmp_path, 0) & _rank_steps(tmp_path, 1)
    assert max(both) == common  # what the next launch resumes from
    # and the launcher says what was saved: when the agreed step is a periodic save step
    # (one time in five), rank 1 saved it before hanging in its preemption save, and every
    # rank did save it; otherwise rank 1 never saved the agreed step
    stop = saved[0]["step"]
    if stop == common:
        assert f"every rank (2) saved script step {stop} and exited" in out, out[-3000:]
        assert "without a checkpoint of it" not in out
    else:
        assert "without a checkpoint of it (1 of 2 rank(s) saved it)" in out, out[-3000:]
        assert f"step {common} at the latest" in out
        assert "every rank saved" not in out and "every rank (2) saved" not in out
    assert no_leftover_workers(run2)


def test_signal_before_the_first_step(tmp_path: Path, run_id: str) -> None:
    """The signal before any step: the ranks (not asking yet) end at once, nothing is
    saved, no restart, code 14. A real launch: the signal while the processes start."""
    proc = launch(tmp_path, run_id, "--signal-step", "0")
    code, out = finish(proc)
    assert code == EXIT_PREEMPTED, out[-3000:]
    assert events(tmp_path, "saved") == []
    run_dir = tmp_path / "logs" / "heartbeat" / run_id
    assert not (run_dir / "restarts.jsonl").exists() or not read_jsonl(run_dir / "restarts.jsonl")
    assert no_leftover_workers(run_id)
