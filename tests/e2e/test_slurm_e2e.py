"""End to end under a real Slurm: ``rankguard slurm sbatch --submit`` on a one-node
cluster of Debian's slurmctld, slurmd and munge started for these tests
(tests/slurm_cluster.py). Two jobs: one whose first run crashes (the job's retry
requeues it, it resumes from the checkpoint), then ``scancel --signal=TERM`` to the
steps, then the preemption config's ``--signal=B:TERM@90`` from slurmctld's own timer ->
each time every rank saves one step, exit 14, requeued, resumed, and its last run
completes; a node that excludes itself -> the requeued job's ``ExcNodeList``. Skipped,
with the reason, where Slurm cannot start here.

Why real jobs: the sbatch script, Slurm's requeue and the signals it delivers are what
these show; what the script says (its options, the requeue and exit-code handling) is
tested on the generated text in ``tests/unit/slurm``.

Slurm holds a requeued job before it may start again (its begin time, about two
minutes); the tests move that begin time to now (``scontrol update StartTime=now``) as
an operator could, so that a run takes seconds."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankguard.launcher.exitcodes import EXIT_CRASH, EXIT_NODE_EXCLUDED, EXIT_PREEMPTED
from tests import slurm_cluster
from tests.slurm_cluster import SlurmCluster

from .conftest import FAST, SCRIPTS, free_port, read_jsonl

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slurm,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("slurm"),
]

TRAIN = str(SCRIPTS / "slurm_train.py")  # without torch.optim: no torch._dynamo
_JOB_TIMEOUT_S = 150.0
# a requeued job is released this long after it was seen held (see wait_job)
_RELEASE_AFTER_S = 3.0
# The requeue job's steps: the sleep of the first three runs' steps (60 s in all) covers
# the third run's wait for slurmctld's timed signal (up to 45 s) after the two stops
# before it; the fourth run trains what is left without the sleep. Fewer, longer steps
# than 450 of 0.1 s: the same time to wait, a third of the steps to train.
STEPS = 200
STEP_SLEEP = 0.3


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = slurm_cluster.start()
    if isinstance(cluster, str):
        pytest.skip(f"no Slurm cluster here: {cluster}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _rankguard_bin(tmp_path: Path) -> Path:
    """``rankguard`` on the node: this interpreter with this checkout's package (the
    batch job inherits the environment, PYTHONPATH included)."""
    path = tmp_path / "rankguard"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m rankguard.cli.main "$@"\n')
    path.chmod(0o755)
    return path


def submit(slurm: SlurmCluster, tmp_path: Path, *options: str, train: tuple[str, ...]) -> str:
    """``rankguard slurm sbatch --submit`` from ``tmp_path`` (the submit directory): 2
    gloo ranks, no GPU, fast heartbeats; the job id."""
    sets = [w for item in FAST for w in ("--set", item)]
    cmd = [
        sys.executable,
        "-m",
        "rankguard.cli.main",
        "slurm",
        "sbatch",
        "--submit",
        "-o",
        str(tmp_path / "job.sbatch"),
        "-t",
        "10",
        "--gpus-per-node",
        "0",
        "--nproc-per-node",
        "2",
        "--rdzv-port",
        str(free_port()),
        "--log-dir",
        str(tmp_path / "logs"),
        "--job-output",
        str(tmp_path / "slurm-%j.out"),
        "--rankguard-bin",
        str(_rankguard_bin(tmp_path)),
        *sets,
        *options,
        TRAIN,
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        *train,
    ]
    env = slurm.env({**os.environ, "PYTHONUNBUFFERED": "1"})
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path, check=False
    )
    assert res.returncode == 0, res.stderr[-3000:]
    job = res.stdout.strip().splitlines()[-1]
    assert job.isdigit(), res.stdout
    return job


def job_fields(slurm: SlurmCluster, job: str) -> dict[str, str]:
    res = slurm.run("scontrol", "show", "job", job)
    assert res.returncode == 0, res.stderr
    return dict(re.findall(r"(\w+)=(\S*)", res.stdout))


def wait_job(
    slurm: SlurmCluster,
    job: str,
    until: tuple[str, ...],
    *,
    restarts: int = 0,
    timeout: float = _JOB_TIMEOUT_S,
) -> dict[str, str]:
    """Wait until the job's state is one of ``until`` with ``restarts`` requeues; a
    requeued job waiting for its begin time is released a few seconds after the requeue.

    Not at once: when a run ends, slurmd revokes the job's credential, and refuses a
    launch of the same job whose credential is from the same second ("Job ... already
    killed, do not launch batch job": the requeued job FAILED with exit code 1 and
    wrote nothing). Slurm's own hold of a requeued job (its begin time) keeps it apart."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    held_since: float | None = None
    while time.monotonic() < deadline:
        fields = job_fields(slurm, job)
        done = int(fields.get("Restarts", "0")) >= restarts
        if fields.get("JobState") in until and done:
            return fields
        if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
            held_since = time.monotonic() if held_since is None else held_since
            if time.monotonic() - held_since >= _RELEASE_AFTER_S:
                slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
        else:
            held_since = None
        time.sleep(0.5)
    raise AssertionError(f"job {job} not {until} after {timeout:g} s: {fields}")


def output(tmp_path: Path, job: str) -> str:
    path = tmp_path / f"slurm-{job}.out"
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def events(tmp_path: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(tmp_path / "ckpt" / "events.jsonl") if e["event"] == kind]


def _last_record(path: Path) -> dict | None:
    """The newest complete line of a heartbeat file (None before the first)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:  # the line being appended
            continue
    return None


def _stepping(tmp_path: Path, job: str, run: int, steps: int = 3) -> bool:
    """Both ranks of the job's run ``run`` (0: the first, 1: requeued once, ...) issued
    ``steps`` training steps, as their heartbeats (the files of the pids their start
    events name) say: each one's loop asked ``should_stop()`` after its first step, so
    an exit signal from now on is caught and saved (before that question it ends the
    rank, as it would without rankguard: nothing saved)."""
    starts = [e for e in events(tmp_path, "start") if e["slurm_run"] == run]
    if len(starts) < 2:
        return False
    run_dir = tmp_path / "logs" / "heartbeat" / job
    for start in starts:
        rec = _last_record(run_dir / f"rank_{start['rank']}_pid_{start['pid']}.heartbeat.jsonl")
        if rec is None or rec["progress_seq"] - rec.get("checkpoint_count", 0) < steps:
            return False
    return True


def _run_time_s(fields: dict[str, str]) -> int:
    """The job's ``RunTime`` (``[D-]HH:MM:SS``) in seconds."""
    days, _, clock = fields["RunTime"].rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def _set_time_limit(slurm: SlurmCluster, job: str, minutes: int) -> None:
    res = slurm.run("scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
    assert res.returncode == 0, res.stderr


def _warning_signals(slurm: SlurmCluster, job: str) -> int:
    """How many times slurmctld's own timer sent the job its ``--signal`` (its log)."""
    text = (slurm.root / "slurmctld.log").read_text(encoding="utf-8", errors="replace")
    return len(re.findall(rf"warning signal {int(signal.SIGTERM)} to JobId={job}\b", text))


def test_a_crash_then_scancel_term_then_slurms_timed_signal_each_requeued_and_resumed(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """One job, four runs. The first: a rank crashes at step 6, the job's retry requeues
    it and the next run resumes from the checkpoint (step 4). The second:
    ``scancel --signal=TERM`` (every step's processes). The third: the preemption config's
    ``--signal=B:TERM@90`` sent by slurmctld's own timer (SIGTERM to the batch shell
    alone; the script passes it on to the launchers). Each signal: every rank saves one
    step, exit 14, the job is requeued and resumes from the step after that save; the
    fourth run completes.

    The timed signal: the running job's time limit is brought within 120 s of its end
    (``scontrol update TimeLimit``, as an operator could; the signal's 90 s plus the 30 s
    of slurmctld's time-limit check, which runs every 30 s: a compile-time constant, no
    option), so the next check, at most 30 s later, sends it; the limit goes back to 10
    minutes once the signal came, or the next run would get it at its first check. The
    ranks train meanwhile: the steps are enough for that and the two agreed stops; the
    fourth run steps without the sleep (up to 55 s of waiting for the rest of the steps
    otherwise, where the signal came early)."""
    job = submit(
        slurm,
        tmp_path,
        "--job-retries",
        "3",
        "--max-restarts",
        "0",
        "--set",
        "fault_tolerance.enable_ft_package=true",
        "--set",
        "preemption.enable_exit_handler=true",
        # the fourth run trains what is left at full speed: nothing waits for it
        train=(
            "--steps",
            str(STEPS),
            "--step-sleep",
            str(STEP_SLEEP),
            "--sleep-runs",
            "3",
            "--ckpt-every",
            "4",
            "--crash-step",
            "6",
        ),
    )
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:TERM@90" in script  # preempt_time 60 + 30
    for run in (1, 2):
        deadline = time.monotonic() + 90
        # not a fixed sleep: under load the first steps of a run can take longer than
        # that, and a signal before the loop's first should_stop() saves nothing
        while not _stepping(tmp_path, job, run):
            # a requeued job waiting for its begin time is released at once
            wait_job(slurm, job, ("RUNNING",), restarts=run)
            assert time.monotonic() < deadline, output(tmp_path, job)[-3000:]
            time.sleep(0.2)
        if run == 1:
            res = slurm.run("scancel", "--signal=TERM", job)
            assert res.returncode == 0, res.stderr
            continue
        assert _warning_signals(slurm, job) == 0
        # 60 to 120 s left: the signal at the next check, 30 s or more before the end
        _set_time_limit(slurm, job, _run_time_s(job_fields(slurm, job)) // 60 + 2)
        deadline = time.monotonic() + 45
        while "received SIGTERM: passed to the launchers" not in output(tmp_path, job):
            assert time.monotonic() < deadline, output(tmp_path, job)[-3000:]
            time.sleep(0.2)
        _set_time_limit(slurm, job, 10)
    fields = wait_job(slurm, job, ("COMPLETED", "FAILED", "CANCELLED"), restarts=3)
    out = output(tmp_path, job)
    assert fields["JobState"] == "COMPLETED", out[-3000:]
    # the crash: requeued as retryable, the next run from the step after the checkpoint
    assert f"rankguard run exited with code {EXIT_CRASH}" in out, out[-3000:]
    assert f"requeue: code {EXIT_CRASH} is retryable" in out
    assert [e["step"] for e in events(tmp_path, "crash")] == [6]
    starts = sorted((e["slurm_run"], e["rank"], e["start"]) for e in events(tmp_path, "start"))
    assert starts[:4] == [(0, 0, 1), (0, 1, 1), (1, 0, 5), (1, 1, 5)], starts
    # the signals
    assert _warning_signals(slurm, job) == 1, slurm.log("slurmctld")
    assert out.count(f"rankguard run exited with code {EXIT_PREEMPTED}") == 2, out[-3000:]
    assert out.count(f"requeue: code {EXIT_PREEMPTED}") == 2, out[-3000:]
    assert out.count("received SIGTERM: passed to the launchers") == 1, out[-3000:]
    saved = [e for e in events(tmp_path, "saved") if e.get("preempted")]
    assert [e["rank"] for e in saved[:2]] in ([0, 1], [1, 0]), saved
    assert [e["rank"] for e in saved[2:]] in ([0, 1], [1, 0]), saved
    first, second = saved[0]["step"], saved[2]["step"]
    assert saved[1]["step"] == first and saved[3]["step"] == second, saved  # one step
    for run, resumed in ((2, first + 1), (3, second + 1)):
        starts = sorted(e["start"] for e in events(tmp_path, "start") if e["slurm_run"] == run)
        assert starts == [resumed] * 2, (run, starts)
    # the last run completed: the job's end as Slurm and the output say it
    assert sorted(e["step"] for e in events(tmp_path, "done")) == [STEPS, STEPS]
    assert sorted(e["rank"] for e in events(tmp_path, "done")) == [0, 1]
    assert fields["ExitCode"] == "0:0" and fields["Restarts"] == "3", fields
    assert "rankguard run exited with code 0" in out and "done: training completed" in out


def test_a_node_that_excludes_itself_is_left_out_of_the_next_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Exit 15: the job goes again as a new job without the host (Slurm takes no
    ExcNodeList for a running job, and its requeue ends the batch script at once). Here
    the one node is left out, so the new job waits for another."""
    job = submit(
        slurm,
        tmp_path,
        "--job-retries",
        "1",
        "--max-restarts",
        "1",
        "--set",
        "fault_tolerance.enable_ft_package=true",
        "--set",
        "fault_tolerance.exclude_after_restarts=1",
        train=("--steps", "12", "--crash-step", "3"),
    )
    new: str | None = None
    try:
        fields = wait_job(slurm, job, ("COMPLETED", "FAILED", "CANCELLED"))
        out = output(tmp_path, job)
        assert fields["ExitCode"] == f"{EXIT_NODE_EXCLUDED}:0", out[-3000:]
        assert f"rankguard run exited with code {EXIT_NODE_EXCLUDED}" in out, out[-3000:]
        assert f"exclude: {slurm.host} " in out, out[-3000:]
        found = re.search(r"resubmit: code 15 is retryable, job retry 1 of 1: job (\d+) runs", out)
        assert found is not None, out[-3000:]
        new = found.group(1)
        again = wait_job(slurm, new, ("PENDING",))
        assert again.get("ExcNodeList") == slurm.host, again
        assert again["JobName"] == fields["JobName"]
    finally:
        slurm.run("scancel", job, *([new] if new else []))
