"""``rankguard slurm``: sbatch rendering, the generated script run by bash against fake
srun/scontrol/sbatch (tests/fakes/bin), the retry decision and the retry wrapper."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rankguard.launcher.exitcodes import EXIT_CRASH, EXIT_FAILED, EXIT_HANG, RETRYABLE
from rankguard.slurm import Decision, SbatchSpec, decide, parse_job_id, render_sbatch
from rankguard.slurm import cli as slurm_cli
from rankguard.slurm.retry import run_with_retries
from tests.factories import FAKE_BIN, read_jsonl

JOB_ID = "777"

pytestmark = pytest.mark.timeout(60)

# A stand-in for `rankguard` on the compute nodes: logs argv and its node, exits with
# FAKE_RANKGUARD_EXIT (or FAKE_RANKGUARD_EXIT_NODE<i> for node i).
FAKE_RANKGUARD = """#!/usr/bin/env python3
import json, os, sys
node = os.environ.get("SLURM_NODEID", "")
with open(os.environ["FAKE_RANKGUARD_LOG"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "node_id": node}) + "\\n")
code = os.environ.get("FAKE_RANKGUARD_EXIT_NODE" + node) or os.environ.get("FAKE_RANKGUARD_EXIT")
if node == "0" and os.environ.get("FAKE_RANKGUARD_EXCLUDE"):  # rank 0 names a faulty host
    with open(os.environ["RANKGUARD_EXCLUDE_FILE"], "w") as fh:
        fh.write(os.environ["FAKE_RANKGUARD_EXCLUDE"] + "\\n")
if os.environ.get("FAKE_RANKGUARD_EXCLUDED_NODE" + node):  # this node excluded itself
    with open(os.environ["RANKGUARD_EXCLUDE_FILE"] + ".node." + str(os.getpid()), "w") as fh:
        fh.write(os.environ["FAKE_RANKGUARD_EXCLUDED_NODE" + node] + "\\n")
sys.exit(int(code or 0))
"""


def spec(**kw: Any) -> SbatchSpec:
    base: dict[str, Any] = {
        "job_name": "llama",
        "nodes": 2,
        "time_limit": "04:00:00",
        "gpus_per_node": 8,
        "nproc_per_node": 8,
        "script": "train.py",
        "script_args": ["--lr", "3e-4"],
        "num_job_retries_on_failure": 2,
    }
    base.update(kw)
    return SbatchSpec(**base)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class Cluster:
    """A generated script run by bash with the fakes first on PATH."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        rg = self.bin / "rankguard"
        rg.write_text(FAKE_RANKGUARD)
        rg.chmod(0o755)
        self.slurm_log = tmp_path / "slurm.jsonl"
        self.rg_log = tmp_path / "rankguard.jsonl"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "FAKE_"))}
        env.update(
            PATH=f"{self.bin}{os.pathsep}{FAKE_BIN}{os.pathsep}{env.get('PATH', '')}",
            SLURM_JOB_ID=JOB_ID,
            SLURM_JOB_NODELIST="gpu[07-08]",
            SLURM_NNODES="2",
            FAKE_SLURM_LOG=str(self.slurm_log),
            FAKE_RANKGUARD_LOG=str(self.rg_log),
        )
        env.update(extra)
        return env

    def run(self, script_text: str, **extra: str) -> subprocess.CompletedProcess[str]:
        script = self.tmp / "job.sbatch"
        script.write_text(script_text)
        return subprocess.run(
            ["bash", str(script)],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def requeues(self) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.slurm_log) if r.get("action") == "requeue"]

    def launches(self) -> list[dict[str, Any]]:
        return sorted(read_jsonl(self.rg_log), key=lambda r: r["node_id"])


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


# --- decide -------------------------------------------------------------------------

DECIDE_TABLE = [
    # exit code, SLURM_RESTART_COUNT, max retries, decision
    (0, 0, 2, Decision.DONE),
    (0, 5, 0, Decision.DONE),
    (14, 0, 0, Decision.REQUEUE),  # preempted: always requeued, no retry spent
    (14, 5, 2, Decision.REQUEUE),
    (EXIT_HANG, 0, 2, Decision.REQUEUE),
    (EXIT_HANG, 1, 2, Decision.REQUEUE),
    (EXIT_HANG, 2, 2, Decision.GIVE_UP),
    (EXIT_CRASH, 2, 2, Decision.GIVE_UP),
    (EXIT_CRASH, 0, 1, Decision.REQUEUE),
    (3, 0, 1, Decision.REQUEUE),
    (3, 0, 0, Decision.GIVE_UP),
    (EXIT_FAILED, 0, 2, Decision.GIVE_UP),
    (2, 0, 2, Decision.GIVE_UP),
    (12, 0, 2, Decision.GIVE_UP),
    (18, 0, 2, Decision.GIVE_UP),  # the launcher found that the failure will repeat
    (137, 0, 2, Decision.GIVE_UP),
    (143, 0, 2, Decision.GIVE_UP),
]


@pytest.mark.parametrize(("code", "count", "max_retries", "expected"), DECIDE_TABLE)
def test_decide_table(code: int, count: int, max_retries: int, expected: Decision) -> None:
    assert decide(code, count, max_retries) is expected


def test_decide_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="restart_count"):
        decide(10, -1, 2)
    with pytest.raises(ValueError, match="max_retries"):
        decide(10, 0, -1)


def test_retryable_codes_are_the_launchers() -> None:
    # unhealthy GPU, hang, crash, straggler, preempted, node excluded (15), rerun: resume
    # (16), faulty GPU (17)
    assert set(RETRYABLE) == {3, 10, 11, 13, 14, 15, 16, 17}


def test_script_exit_16_requeues_without_exclude(cluster: Cluster) -> None:
    proc = cluster.run(
        render_sbatch(spec()), FAKE_RANKGUARD_EXIT="16", SLURM_SUBMIT_DIR=str(cluster.tmp)
    )
    assert proc.returncode == 16 and len(cluster.requeues()) == 1
    assert not [r for r in read_jsonl(cluster.slurm_log) if r.get("action") == "update"]


def resubmits(cluster: Cluster) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(cluster.slurm_log) if r.get("cmd") == "sbatch"]


def test_script_exit_17_resubmits_excluding_the_named_hosts(cluster: Cluster) -> None:
    """Slurm takes no ExcNodeList for a running job and its requeue ends the script: the
    job goes again as a new one, after this one, without the hosts, in the same run."""
    env = {"SLURM_SUBMIT_DIR": str(cluster.tmp), "FAKE_RANKGUARD_EXIT": "17"}
    proc = cluster.run(
        render_sbatch(spec()), FAKE_RANKGUARD_EXCLUDE="gpu08", SLURM_RESTART_COUNT="0", **env
    )
    assert proc.returncode == 17, proc.stdout + proc.stderr
    proc = cluster.run(  # the new job: another faulty host; both stay excluded
        render_sbatch(spec()),
        FAKE_RANKGUARD_EXCLUDE="gpu03",
        SLURM_JOB_ID="4242",
        RANKGUARD_SLURM_RUN_ID=JOB_ID,
        RANKGUARD_SLURM_RETRIES="1",
        **env,
    )
    assert proc.returncode == 17, proc.stdout + proc.stderr
    calls = resubmits(cluster)
    assert [c["argv"][:3] for c in calls] == [
        ["--parsable", "--exclude=gpu08", f"--dependency=afterany:{JOB_ID}"],
        ["--parsable", "--exclude=gpu03,gpu08", "--dependency=afterany:4242"],
    ]
    assert calls[0]["file"] == str(cluster.tmp / "job.sbatch")  # this very script
    keys = ("RANKGUARD_SLURM_RUN_ID", "RANKGUARD_SLURM_RETRIES", "SLURM_RESTART_COUNT")
    assert [tuple(c["env"].get(k) for k in keys) for c in calls] == [
        (JOB_ID, "1", None),  # the job's own restart count is not the new job's
        (JOB_ID, "2", None),
    ]
    assert cluster.requeues() == []
    assert "exclude: gpu03,gpu08 (exit 17" in proc.stdout
    assert "resubmit: code 17 is retryable, job retry 2 of 2: job 4242 runs" in proc.stdout
    # the new job is the same run: its rendezvous id, its run directory
    assert [flag(r["argv"], "--rdzv-id") for r in cluster.launches()] == [JOB_ID] * 4


def test_script_exit_15_resubmits_excluding_every_excluded_node(cluster: Cluster) -> None:
    env = {"SLURM_SUBMIT_DIR": str(cluster.tmp), "FAKE_RANKGUARD_EXIT": "15"}
    proc = cluster.run(
        render_sbatch(spec()),
        FAKE_RANKGUARD_EXCLUDED_NODE0="gpu02",
        FAKE_RANKGUARD_EXCLUDED_NODE1="gpu05",
        **env,
    )
    assert proc.returncode == 15, proc.stdout + proc.stderr
    assert [c["argv"][1] for c in resubmits(cluster)] == ["--exclude=gpu02,gpu05"]
    assert cluster.requeues() == []
    assert "exclude: gpu02,gpu05 (exit 15" in proc.stdout


def test_script_requeues_as_is_when_the_resubmission_fails(cluster: Cluster) -> None:
    env = {"SLURM_SUBMIT_DIR": str(cluster.tmp), "FAKE_RANKGUARD_EXIT": "15"}
    proc = cluster.run(
        render_sbatch(spec()), FAKE_RANKGUARD_EXCLUDED_NODE0="gpu02", FAKE_SBATCH_EXIT="1", **env
    )
    assert proc.returncode == 15
    assert len(cluster.requeues()) == 1
    assert "warning: sbatch failed: requeued as is" in proc.stdout


# --- rendering ----------------------------------------------------------------------


def test_render_directives_for_two_nodes() -> None:
    text = render_sbatch(
        spec(partition="batch", account="proj", signal="TERM@60", extra_sbatch=["--exclusive"])
    )
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=llama",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=04:00:00",
        "#SBATCH --partition=batch",
        "#SBATCH --account=proj",
        "#SBATCH --output=slurm-%x-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        "#SBATCH --signal=TERM@60",
        "#SBATCH --exclusive",
    ]
    # Directives come before the first command, or sbatch ignores them.
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)
    assert "srun --kill-on-bad-exit=0 --ntasks-per-node=1" in text
    assert "RG_MAX_JOB_RETRIES=2" in text
    assert 'scontrol show hostnames "${SLURM_JOB_NODELIST' in text
    assert "scontrol requeue" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=10)


def test_optional_directives_left_out() -> None:
    text = render_sbatch(spec(gpus_per_node=0, nproc_per_node=2))
    assert "--gpus-per-node" not in text
    assert "--partition" not in text and "--account" not in text
    assert "#SBATCH --signal" not in text  # (the script's scancel --signal forwards one)
    assert "--max-restarts" not in text and "--log-dir" not in text


def test_user_values_are_quoted() -> None:
    text = render_sbatch(
        spec(job_name="my job #1", script_args=["--name", "my run $HOME"], account="a b")
    )
    assert "#SBATCH --job-name='my job #1'" in text
    assert "#SBATCH --account='a b'" in text
    assert "--name 'my run $HOME'" in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nodes", 0),
        ("ntasks_per_node", 8),
        ("gpus_per_node", -1),
        ("nproc_per_node", 0),
        ("time_limit", "4h"),
        ("num_job_retries_on_failure", -1),
        ("max_restarts", -2),
        ("rdzv_port", 70000),
        ("signal", "TERM 60"),
        ("job_name", "a\nb"),
        ("job_name", ""),
        ("partition", ""),
        ("extra_sbatch", ["exclusive"]),
        ("script", ""),
        ("script", "--lr"),
    ],
)
def test_spec_validation_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        spec(**{field: value})


def test_time_formats_accepted() -> None:
    for t in ("30", "30:00", "04:00:00", "1-00", "1-12:00", "2-00:00:00", "UNLIMITED"):
        spec(time_limit=t)


# --- the generated script, run by bash ----------------------------------------------


def test_script_success_no_requeue(cluster: Cluster) -> None:
    text = render_sbatch(spec(script_args=["--name", "my run $HOME", "it's"], max_restarts=3))
    proc = cluster.run(text, FAKE_RANKGUARD_EXIT="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cluster.requeues() == []
    assert "done: training completed" in proc.stdout
    launches = cluster.launches()
    assert [r["node_id"] for r in launches] == ["0", "1"]
    for r in launches:
        argv = r["argv"]
        assert argv[0] == "run"
        assert flag(argv, "--node-rank") == r["node_id"]
        assert flag(argv, "--rdzv-id") == JOB_ID
        assert flag(argv, "--rdzv-endpoint") == "gpu07:29500"  # the first host
        assert flag(argv, "--nnodes") == "2"
        assert flag(argv, "--nproc-per-node") == "8"
        assert flag(argv, "--max-restarts") == "3"
        # The script and its arguments arrive literally: no expansion of $HOME, no split.
        assert argv[argv.index("train.py") :] == ["train.py", "--name", "my run $HOME", "it's"]
    srun = [r for r in read_jsonl(cluster.slurm_log) if r["cmd"] == "srun"]
    assert len(srun) == 1
    assert srun[0]["argv"][:2] == ["--kill-on-bad-exit=0", "--ntasks-per-node=1"]
    assert srun[0]["env"]["SLURM_JOB_ID"] == JOB_ID


def test_script_rendezvous_host_from_fake_hosts(cluster: Cluster) -> None:
    proc = cluster.run(render_sbatch(spec(rdzv_port=6000)), FAKE_SLURM_HOSTS="alpha,beta")
    assert proc.returncode == 0, proc.stderr
    endpoints = {flag(r["argv"], "--rdzv-endpoint") for r in cluster.launches()}
    assert endpoints == {"alpha:6000"}


def test_script_hang_requeues(cluster: Cluster) -> None:
    proc = cluster.run(render_sbatch(spec()), FAKE_RANKGUARD_EXIT="10", SLURM_RESTART_COUNT="0")
    assert [r["argv"] for r in cluster.requeues()] == [["requeue", JOB_ID]]
    assert proc.returncode == 10
    assert "requeue: code 10 is retryable, job retry 1 of 2" in proc.stdout


def test_script_crash_after_all_retries_gives_up(cluster: Cluster) -> None:
    proc = cluster.run(render_sbatch(spec()), FAKE_RANKGUARD_EXIT="11", SLURM_RESTART_COUNT="2")
    assert cluster.requeues() == []
    assert proc.returncode == 11
    assert "give up: code 11 is retryable but the job used its 2 retries" in proc.stdout


def test_script_not_retryable(cluster: Cluster) -> None:
    proc = cluster.run(render_sbatch(spec()), FAKE_RANKGUARD_EXIT="1")
    assert cluster.requeues() == []
    assert proc.returncode == 1
    assert "give up: code 1 is not retryable" in proc.stdout


def test_script_uses_the_highest_node_code(cluster: Cluster) -> None:
    proc = cluster.run(
        render_sbatch(spec()), FAKE_RANKGUARD_EXIT_NODE0="0", FAKE_RANKGUARD_EXIT_NODE1="10"
    )
    assert proc.returncode == 10
    assert len(cluster.requeues()) == 1


def test_script_logs_are_timestamped(cluster: Cluster) -> None:
    proc = cluster.run(render_sbatch(spec()))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[rankguard slurm")]
    assert len(lines) >= 3
    for line in lines:
        stamp = line.split()[2].rstrip("]")
        assert len(stamp) == 20 and stamp.endswith("Z") and "T" in stamp


def test_script_failed_requeue_is_logged(cluster: Cluster) -> None:
    proc = cluster.run(
        render_sbatch(spec()), FAKE_RANKGUARD_EXIT="10", FAKE_SCONTROL_REQUEUE_EXIT="1"
    )
    assert proc.returncode == 10
    assert "scontrol requeue 777 failed" in proc.stdout


def test_script_outside_slurm_fails(cluster: Cluster) -> None:
    env = cluster.env()
    del env["SLURM_JOB_ID"]
    script = cluster.tmp / "job.sbatch"
    script.write_text(render_sbatch(spec()))
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode != 0
    assert "SLURM_JOB_ID" in proc.stderr
    assert cluster.launches() == []


@pytest.mark.parametrize(("code", "count", "max_retries", "expected"), DECIDE_TABLE)
def test_shell_and_python_decide_agree(
    cluster: Cluster, code: int, count: int, max_retries: int, expected: Decision
) -> None:
    text = render_sbatch(spec(num_job_retries_on_failure=max_retries))
    proc = cluster.run(text, FAKE_SRUN_EXIT=str(code), SLURM_RESTART_COUNT=str(count))
    requeued = len(cluster.requeues()) == 1
    assert requeued == (decide(code, count, max_retries) is Decision.REQUEUE)
    assert proc.returncode == code
    assert expected.name.lower().replace("_", " ") in proc.stdout


# --- rankguard slurm retry ----------------------------------------------------------

COUNTING_COMMAND = """
import os, sys
path = sys.argv[1]
n = int(open(path).read()) if os.path.exists(path) else 0
open(path, "w").write(str(n + 1))
codes = [int(c) for c in sys.argv[2].split(",")]
sys.exit(codes[min(n, len(codes) - 1)])
"""


def counting(tmp_path: Path, codes: str) -> tuple[list[str], Path]:
    counter = tmp_path / "count"
    return [sys.executable, "-c", COUNTING_COMMAND, str(counter), codes], counter


def parse_cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rankguard")
    sub = parser.add_subparsers(dest="command", required=True)
    slurm_cli.add_parser(sub)
    return parser.parse_args(["slurm", *argv])


def test_retry_until_success(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd, counter = counting(tmp_path, "10,10,0")
    args = parse_cli("retry", "--max-retries", "3", "--", *cmd)
    assert args.func(args) == 0
    assert counter.read_text() == "3"
    err = capsys.readouterr().err
    assert "attempt 1/4 exited with code 10: retryable, retry" in err
    assert "attempt 3/4 exited with code 0: done" in err


def test_retry_gives_up_after_max(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd, counter = counting(tmp_path, "11")
    args = parse_cli("retry", "--max-retries", "1", "--", *cmd)
    assert args.func(args) == 11
    assert counter.read_text() == "2"
    assert "attempt 2/2 exited with code 11: retries spent, give up" in capsys.readouterr().err


def test_retry_not_retryable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd, counter = counting(tmp_path, "1")
    args = parse_cli("retry", "--max-retries", "5", "--", *cmd)
    assert args.func(args) == 1
    assert counter.read_text() == "1"
    assert "not retryable" in capsys.readouterr().err


def test_retry_gives_up_on_a_failure_that_will_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd, counter = counting(tmp_path, "18")
    args = parse_cli("retry", "--max-retries", "5", "--", *cmd)
    assert args.func(args) == 18
    assert counter.read_text() == "1"
    assert "code 18: the launcher found that the failure will repeat" in capsys.readouterr().err


def test_retry_signal_exit_and_missing_command(tmp_path: Path) -> None:
    messages: list[str] = []
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert run_with_retries(killed, max_retries=2, log=messages.append) == 137
    assert len([m for m in messages if "exited with code 137" in m]) == 1
    assert run_with_retries([str(tmp_path / "nope")], max_retries=2, log=messages.append) == 127


def test_retry_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_cli("retry", "--max-retries", "1", "--")
    assert args.func(args) == 2
    args = parse_cli("retry", "--max-retries", "-1", "--", "true")
    assert args.func(args) == 2
    assert "max_retries" in capsys.readouterr().err


def test_retry_sigterm_is_forwarded_and_stops_retries(tmp_path: Path) -> None:
    started = tmp_path / "started"
    child = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(10))\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(30)\n"
    )
    wrapper = (
        "import sys\n"
        "from rankguard.slurm.retry import run_with_retries\n"
        "sys.exit(run_with_retries([sys.executable, '-c', sys.argv[1]], max_retries=5))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, child], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while not started.exists():
            assert time.monotonic() < deadline, "the attempt never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The attempt got SIGTERM and exited 10 (retryable), but a stopped job is not retried.
    assert proc.returncode == 10, err
    assert err.count("attempt ") == 2  # "attempt 1/6: ..." and its result
    assert "SIGTERM received: stop" in err


# --- rankguard slurm sbatch ---------------------------------------------------------


def test_sbatch_cli_prints_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("rg.yaml").write_text("heartbeat:\n  enabled: true\n")
    args = parse_cli(
        "sbatch", "-N", "2", "-t", "01:00:00", "--job-retries", "3", "--max-restarts", "2",
        "--config", "rg.yaml", "--sbatch=--exclusive", "fault_tolerance.enable_ft_package=true",
        "train.py", "--lr", "1e-3",
    )  # fmt: skip
    assert args.func(args) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "#SBATCH --job-name=train" in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --exclusive" in text
    assert "RG_MAX_JOB_RETRIES=3" in text
    assert "--max-restarts 2" in text
    assert "--config rg.yaml --set fault_tolerance.enable_ft_package=true" in text
    assert "train.py --lr 1e-3" in text
    assert "--log-dir" not in text  # the config's log_dir is left alone
    assert "WARNING" not in captured.err


def test_sbatch_cli_job_retries_from_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("rg.yaml").write_text(
        "fault_tolerance:\n  enable_ft_package: true\n  num_job_retries_on_failure: 4\n"
    )
    args = parse_cli("sbatch", "-t", "10", "--config", "rg.yaml", "train.py")
    assert args.func(args) == 0
    assert "RG_MAX_JOB_RETRIES=4" in capsys.readouterr().out
    args = parse_cli("sbatch", "-t", "10", "--config", "rg.yaml", "--job-retries", "1", "t.py")
    assert args.func(args) == 2
    assert "disagree" in capsys.readouterr().err
    args = parse_cli("sbatch", "-t", "10", "fault_tolerance.num_in_job_restarts=2",
                     "--max-restarts", "3", "t.py")  # fmt: skip
    # A bare override ends the options: "--max-restarts" would be the script.
    assert args.func(args) == 2
    assert "looks like an option" in capsys.readouterr().err
    args = parse_cli("sbatch", "-t", "10", "--max-restarts", "3",
                     "fault_tolerance.num_in_job_restarts=2", "t.py")  # fmt: skip
    assert args.func(args) == 2
    assert "--max-restarts 3 and fault_tolerance.num_in_job_restarts=2" in capsys.readouterr().err


def test_sbatch_cli_warns_when_retries_cannot_happen(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_cli("sbatch", "-t", "10", "--job-retries", "2", "train.py")
    assert args.func(args) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "enable_ft_package=false" in err and "never be requeued" in err


def test_sbatch_cli_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_cli("sbatch", "-t", "10", "fault_tolerance.nope=1", "train.py")
    assert args.func(args) == 2
    assert "nope" in capsys.readouterr().err


def test_sbatch_cli_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_cli("sbatch", "-N", "0", "-t", "10", "train.py")
    assert args.func(args) == 2
    assert "nodes" in capsys.readouterr().err


def test_sbatch_cli_writes_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.sbatch"
    args = parse_cli("sbatch", "-t", "10", "-o", str(out), "train.py")
    assert args.func(args) == 0
    assert out.read_text().startswith("#!/bin/bash\n")
    assert capsys.readouterr().out == ""


def test_sbatch_submit_prints_job_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "slurm.jsonl"
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    monkeypatch.delenv("FAKE_SBATCH_EXIT", raising=False)
    monkeypatch.delenv("FAKE_SBATCH_JOB_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    args = parse_cli("sbatch", "-t", "10", "-N", "2", "--submit", "train.py")
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == "4242"
    (record,) = read_jsonl(log)
    assert record["cmd"] == "sbatch"
    assert Path(record["file"]) == Path("rankguard_logs/slurm/train.sbatch")
    assert "#SBATCH --nodes=2" in record["script"]


def test_sbatch_submit_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH_EXIT", "1")
    args = parse_cli("sbatch", "-t", "10", "-o", str(tmp_path / "j.sh"), "--submit", "train.py")
    assert args.func(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "failed" in captured.err


def test_parse_job_id() -> None:
    assert parse_job_id("Submitted batch job 4242\n") == "4242"
    assert parse_job_id("Submitted batch job 17 on cluster c1\n") == "17"
    assert parse_job_id("4243;cluster\n") == "4243"
    assert parse_job_id("error\n") is None


def test_fake_scontrol_expands_node_lists() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    proc = subprocess.run(
        [str(FAKE_BIN / "scontrol"), "show", "hostnames", "gpu[01-02,7],login"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert proc.stdout.split() == ["gpu01", "gpu02", "gpu7", "login"]


def test_sbatch_signal_from_preempt_time(capsys: pytest.CaptureFixture[str]) -> None:
    """With preemption on and no --signal: SIGTERM to the batch shell preempt_time + 30 s
    before the limit; the script passes it to srun (the launchers)."""
    args = parse_cli(
        "sbatch",
        "-t",
        "01:00:00",
        "--set",
        "preemption.enable_exit_handler=true",
        "--set",
        "preemption.preempt_time=90",
        "train.py",
    )
    spec_, _cfg = slurm_cli.spec_from_args(args)
    assert spec_.signal == "B:TERM@120"
    text = render_sbatch(spec_)
    assert "#SBATCH --signal=B:TERM@120" in text
    assert 'trap "rg_forward $rg_sig" "$rg_sig"' in text
    args = parse_cli("sbatch", "-t", "01:00:00", "train.py")
    assert slurm_cli.spec_from_args(args)[0].signal is None


def test_retry_requeues_a_preempted_attempt(tmp_path: Path) -> None:
    command, counter = counting(tmp_path, "14,0")
    logs: list[str] = []
    assert run_with_retries(command, max_retries=1, log=logs.append) == 0
    assert counter.read_text() == "2"
    command, counter = counting(
        tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path, "14"
    )
    assert run_with_retries(command, max_retries=0, log=logs.append) == 14
    assert "no attempt left" in logs[-1]


# A srun standing for the launchers: it says it started, and the exit signal it is
# passed makes it exit 14 after a short "save" (what every rankguard run does).
# srun as Slurm's: SIGTERM to srun ends its step (its tasks killed: 137); the launchers
# told by `scancel --signal=TERM <job>` (the fake scancel below leaves a mark) save and
# exit 14
PREEMPTED_SRUN = """#!/usr/bin/env python3
import os, signal, sys, time
def killed(signum, frame):
    print("srun: forcing job termination", file=sys.stderr)
    sys.exit(137)
signal.signal(signal.SIGTERM, killed)
started = os.environ["FAKE_SRUN_STARTED"]
open(started, "w").close()
for _ in range(600):
    if os.path.exists(started + ".tasks"):
        time.sleep(0.3)
        sys.exit(14)
    time.sleep(0.05)
sys.exit(0)
"""
TASKS_SCANCEL = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_SLURM_LOG"], "a") as fh:
    fh.write(json.dumps({"cmd": "scancel", "argv": sys.argv[1:]}) + "\\n")
open(os.environ["FAKE_SRUN_STARTED"] + ".tasks", "w").close()
"""


def test_script_passes_the_exit_signal_to_the_launchers_and_requeues(cluster: Cluster) -> None:
    for name, text in (("srun", PREEMPTED_SRUN), ("scancel", TASKS_SCANCEL)):
        path = cluster.bin / name
        path.write_text(text)
        path.chmod(0o755)
    started = cluster.tmp / "started"
    script = cluster.tmp / "job.sbatch"
    script.write_text(render_sbatch(spec(signal="B:TERM@90", num_job_retries_on_failure=0)))
    proc = subprocess.Popen(
        ["bash", str(script)],
        env=cluster.env(FAKE_SRUN_STARTED=str(started)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not started.exists():
        assert time.monotonic() < deadline, "srun never started"
        time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # Slurm's B:TERM, to the batch shell only
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10  # not the 30 s srun would sleep without it
    assert proc.returncode == 14, (out, err)
    assert "received SIGTERM: passed to the launchers" in out
    assert "exited with code 14" in out
    assert len(cluster.requeues()) == 1  # no retry budget, requeued all the same
    told = [r["argv"] for r in read_jsonl(cluster.slurm_log) if r.get("cmd") == "scancel"]
    assert told == [["--signal=TERM", JOB_ID]]  # the job's steps, not the batch shell


# scontrol as Slurm's for a running job: `scontrol requeue` sends SIGTERM to the batch
# shell (the job's allocation ends, to be queued again); the other commands as the fake's
REQUEUE_TERMS_SCONTROL = f"""#!/usr/bin/env python3
import json, os, signal, sys, time
if sys.argv[1:2] == ["requeue"]:
    with open(os.environ["FAKE_SLURM_LOG"], "a") as fh:
        fh.write(json.dumps({{"cmd": "scontrol", "argv": sys.argv[1:], "action": "requeue",
                             "job_id": sys.argv[2]}}) + "\\n")
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(0.3)
    sys.exit(0)
os.execv({str(FAKE_BIN / "scontrol")!r}, [{str(FAKE_BIN / "scontrol")!r}, *sys.argv[1:]])
"""


def test_a_signal_after_the_launchers_ended_is_not_passed_on(cluster: Cluster) -> None:
    """The TERM of the script's own requeue reaches the batch shell after the launchers
    exited 14: said as late, no scancel, no 'passed to the launchers' (nobody saves)."""
    for name, text in (("srun", "#!/bin/sh\nexit 14\n"), ("scontrol", REQUEUE_TERMS_SCONTROL)):
        path = cluster.bin / name
        path.write_text(text)
        path.chmod(0o755)
    res = cluster.run(render_sbatch(spec(signal="B:TERM@90", num_job_retries_on_failure=1)))
    assert res.returncode == 14, (res.stdout, res.stderr)
    assert len(cluster.requeues()) == 1
    assert "received SIGTERM after the launchers ended (code 14): nothing to pass on" in res.stdout
    assert "passed to the launchers" not in res.stdout
    assert not [r for r in read_jsonl(cluster.slurm_log) if r.get("cmd") == "scancel"]
