"""End to end: no worker outlives ``rankguard run``. A SIGKILLed launcher (it cannot
handle it) takes its ranks with it (and ``--preload``'s fork server), and the processes
each rank started itself (a 300 s sleep) with them. SIGTERM stops a job in
``test_run_files_e2e``, SIGINT in ``test_flightrec_e2e`` (after its hang's finding).
Real launches: signals to the launcher and what becomes of its process tree."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    kill_all,
    leftover_processes,
    no_leftover_workers,
    outliving,
    rank_children,
    rankguard_cmd,
    read_status,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

GONE_WITHIN_S = 10.0  # measured: well under a second (docs/fault_tolerance.md)


DEMO = ("-m", "rankguard.demo.train", "--steps", "100000")


def start_job(
    tmp_path: Path, run_id: str, *extra: str, target: tuple[str, ...] = DEMO
) -> tuple[subprocess.Popen[str], Path]:
    """A 2-rank job that trains until stopped (the demo unless ``target``), once both
    ranks publish heartbeats."""
    proc = subprocess.Popen(
        rankguard_cmd(*standalone_run(run_id, tmp_path), *extra, *target),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    run_dir = tmp_path / "heartbeat" / run_id
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if (run_dir / "status.json").exists():
            ranks = read_status(run_dir)["ranks"]
            if len(ranks) == 2 and all(r["process_liveness"] == "alive" for r in ranks):
                return proc, run_dir
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    out, _ = proc.communicate()
    pytest.fail(f"the job never had both ranks alive:\n{out}")


@pytest.mark.parametrize("launch", [(), ("--preload", "torch")], ids=["subprocess", "preload"])
def test_sigkill_of_the_launcher_leaves_no_worker_alive(
    tmp_path: Path, run_id: str, launch: tuple[str, ...]
) -> None:
    """Each rank has started a child of its own (a 300 s sleep), which goes with its
    rank: a rank started as a new interpreter, and one forked by ``--preload``'s fork
    server (each leads a process group of its own, its guard's)."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    with_children = (str(SCRIPTS / "with_children.py"), "--end", "never", "--pid-dir", str(pid_dir))
    proc, _run_dir = start_job(tmp_path, run_id, *launch, target=with_children)
    children: list[int] = []
    try:
        children = rank_children(pid_dir, 2)
        workers = [pid for pid in leftover_processes(run_id) if pid not in (proc.pid, *children)]
        # the ranks, and with --preload the fork server (and multiprocessing's tracker)
        assert len(workers) >= 2, workers
        t0 = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()  # reaped, as a shell would
        assert no_leftover_workers(run_id, wait_s=GONE_WITHIN_S), (
            f"still alive {GONE_WITHIN_S} s after the launcher's SIGKILL: "
            f"{leftover_processes(run_id)} (of {workers})"
        )
        print(f"last worker gone {time.monotonic() - t0:.3f} s after the launcher's SIGKILL")
        left = outliving(children, within_s=GONE_WITHIN_S)
        assert not left, f"a rank's child outlived the SIGKILLed launcher: {left}"
        # status.json is frozen at "running"; `rankguard status` says nobody updates it
        assert read_status(_run_dir)["state"] == "running"
        shown = run_rankguard(["status", str(_run_dir)])
        assert shown.returncode == 0, shown.stderr
        assert f"launcher gone (pid {proc.pid} no longer runs: killed?)" in shown.stdout
    finally:
        proc.kill()
        kill_all([*leftover_processes(run_id), *children])  # never leave survivors
