"""End to end: the exit signal mid-run -> every rank saves one step, the launcher exits
EXIT_PREEMPTED (14), and the relaunched job resumes from that step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rankguard.launcher.exitcodes import EXIT_PREEMPTED

from .conftest import (
    SCRIPTS,
    free_port,
    no_leftover_workers,
    node_run,
    rankguard_cmd,
    read_jsonl,
    run_nodes,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PREEMPT = ["--set", "preemption.enable_exit_handler=true"]
TRAIN = str(SCRIPTS / "preempt_train.py")


def launch(
    tmp_path: Path, run_id: str, *train: str, nproc: int = 2, extra: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
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


def test_preempt_saves_one_step_exits_14_and_resumes(tmp_path: Path, run_id: str) -> None:
    """2 ranks: SIGTERM to the launcher during an evaluation, a second one during the
    save; every rank saves the same step; the relaunch resumes right after it. A real launch:
    SIGTERM to the launcher, exit 14 and a relaunch."""
    proc = launch(
        tmp_path, run_id, "--signal-step", "8", "--signal-in", "eval", "--resignal-in-save"
    )
    code, out = finish(proc)
    assert code == EXIT_PREEMPTED, out[-3000:]
    saved = events(tmp_path, "saved")
    assert len(saved) == 2 and len({e["step"] for e in saved}) == 1, saved
    assert all(e["preempted"] for e in saved)
    step = saved[0]["step"]
    assert step > 8
    assert "again: ignored" in out
    kinds = [(f["reason"], f.get("iteration")) for f in findings(tmp_path, run_id)]
    assert ("every_rank_saved_the_agreed_step", step) in kinds, kinds
    assert no_leftover_workers(run_id)

    again = launch(tmp_path, f"{run_id}-2", "--steps", str(step + 3))
    code, out = finish(again)
    assert code == 0, out[-3000:]
    starts = [e["start"] for e in events(tmp_path, "start")[-2:]]
    assert starts == [step + 1, step + 1]


def test_signal_straight_to_a_rank_during_a_checkpoint(tmp_path: Path, run_id: str) -> None:
    """The signal to rank 1 itself (not the launcher) while it is inside a checkpoint:
    the rank passes it to its launcher, and the job is preempted as a whole. A real
    launch: a signal to a rank process."""
    proc = launch(tmp_path, run_id, "--ckpt-every", "10", "--step-sleep", "0.1")
    deadline = time.monotonic() + 90
    target = None
    while time.monotonic() < deadline and target is None:
        starts = (
            [e for e in events(tmp_path, "start") if e["rank"] == 1]
            if (tmp_path / "ckpt" / "events.jsonl").exists()
            else []
        )
        saved = saved_steps(tmp_path / "ckpt" / "rank_1")
        if starts and saved:
            target = starts[0]["pid"]
        time.sleep(0.05)
    assert target is not None, "rank 1 never saved a periodic checkpoint"
    os.kill(target, signal.SIGTERM)
    code, out = finish(proc)
    assert code == EXIT_PREEMPTED, out[-3000:]
    saved = events(tmp_path, "saved")
    assert len(saved) == 2 and len({e["step"] for e in saved}) == 1, saved


def saved_steps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("step_*.pt")) if directory.is_dir() else []


def test_rank_hanging_in_its_save_is_killed_at_the_grace_limit(tmp_path: Path, run_id: str) -> None:
    """Rank 1 hangs in the preemption save: killed when preempt_time is over; the exit
    code is still 14 and the previous checkpoint (every rank's) is what resumes. A real
    launch: the launcher kills a worker process at the grace limit."""
    t0 = time.monotonic()
    proc = launch(
        tmp_path,
        run_id,
        "--signal-step",
        "12",
        "--signal-in",
        "ckpt",
        "--ckpt-every",
        "5",
        "--hang-save-rank",
        "1",
        extra=("--set", "preemption.preempt_time=6"),
    )
    code, out = finish(proc)
    assert code == EXIT_PREEMPTED, out[-3000:]
    assert "were killed" in out
    assert time.monotonic() - t0 < 60
    saved = events(tmp_path, "saved")
    assert [e["rank"] for e in saved] == [0]
    common = saved[0]["step"] // 5 * 5  # the last periodic save of both ranks
    again = launch(tmp_path, f"{run_id}-2", "--steps", str(common + 3))
    code, out = finish(again)
    assert code == 0, out[-3000:]
    starts = [e["start"] for e in events(tmp_path, "start")[-2:]]
    assert starts == [common + 1, common + 1]


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


def test_two_agents_preempted_through_node_one(tmp_path: Path, run_id: str) -> None:
    """Two agents on loopback, the signal to node 1's launcher: both exit 14, every rank
    saves the same step. A real launch: several agents."""
    port = free_port()
    ckpt = str(tmp_path / "ckpt")
    cmds = {
        node: rankguard_cmd(
            *node_run(node, port, run_id, tmp_path / f"logs{node}", nproc=1),
            *PREEMPT,
            TRAIN,
            "--ckpt-dir",
            ckpt,
            "--signal-step",
            "8",
            "--signal-rank",
            "1",
        )
        for node in (0, 1)
    }
    outs, codes = run_nodes(cmds, timeout_s=150)
    assert codes == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}, outs
    saved = events(tmp_path, "saved")
    assert sorted(e["rank"] for e in saved) == [0, 1]
    assert len({e["step"] for e in saved}) == 1, saved
    preempted = [
        json.loads(line)
        for line in (tmp_path / "logs0" / "heartbeat" / run_id / "findings.jsonl")
        .read_text()
        .splitlines()
    ]
    assert any(f["finding_type"] == "job_preempted" for f in preempted)


def test_demo_preempted_saves_through_the_checkpoint_library_and_resumes(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: SIGTERM to the launcher, the demo's save through
    ``rankguard.checkpoint`` in every rank process, exit 14 and a relaunch."""
    # The demo's own loop: SIGTERM to the launcher at step 6 -> every rank saves the agreed
    # step through rankguard.checkpoint (DCP), exit 14; the rerun resumes after that step.
    ckpt = tmp_path / "ckpt"

    def demo(rid: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            rankguard_cmd(
                *standalone_run(rid, tmp_path / "logs", nproc=2),
                *PREEMPT,
                "--set",
                f"checkpoint.save={ckpt}",
                "-m",
                "rankguard.demo.train",
                "--log-every",
                "1",
                "--step-sleep",
                "0.05",
                "--steps",
                "200",
                *extra,
            ),
            capture_output=True,
            text=True,
            timeout=150,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    first = demo(run_id, "--fault", "preempt", "--fault-rank", "0", "--fault-step", "6")
    out = first.stdout + first.stderr
    assert first.returncode == EXIT_PREEMPTED, out
    stop = int(out.split("[demo] stopping at step ")[1].split(":")[0])
    assert stop >= 6
    kinds = {f["finding_type"] for f in findings(tmp_path, run_id)}
    assert kinds == {"job_preempted"}, kinds  # nothing else: a healthy job preempted
    again = demo(run_id + "b", "--steps", str(stop + 2))
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2
    assert f"[demo] resumed from step {stop} (persistent)" in out2
    assert f"[demo] done: {stop + 2} steps on 2 rank(s)" in out2
    assert no_leftover_workers(run_id)
