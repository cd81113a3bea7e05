"""End to end: the process model of a healthy ``--standalone`` job, one launch: the
processes a rank starts itself (a 300 s sleep per rank) end with the job; every listening
socket of the job is on the loopback interface; ``enable_gpu_health_check`` passes on a
healthy GPU and the job's ranks run. The other ways a job ends, with the same children:
a rank that crashes (``test_run_e2e::test_crash_names_the_failing_rank_as_root_cause``)
and a SIGKILL of the launcher (``test_orphans_e2e``). The refusal on an unhealthy GPU is
tested in-process in ``tests/tier2/test_preflight_tier2.py``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.factories import SICK_GPU

from .conftest import SCRIPTS, outliving, rank_children, rankguard_cmd, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FAKE_BIN = Path(__file__).parents[1] / "fakes" / "bin"


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return (
        host.startswith("127.")
        or host == "[00000000000000000000000001000000]"  # ::1
        or (host.startswith("[0000000000000000ffff0000") and host[25:27] == "7f")
    )


def test_a_healthy_standalone_job_on_loopback_whose_ranks_children_end_with_it(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: processes (each rank's own child, the launcher's and the ranks'
    listening sockets) and the health check the launcher runs before it starts them."""
    pid_dir, listeners = tmp_path / "pids", tmp_path / "listeners.json"
    pid_dir.mkdir()
    healthy = {**SICK_GPU, "ecc.errors.uncorrected.volatile.total": "0"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_SMI_")}
    env["PATH"] = f"{FAKE_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["FAKE_SMI_GPUS"] = json.dumps([healthy])
    env["PYTHONUNBUFFERED"] = "1"
    # a file, not a pipe: a leaked child holding the launcher's output open must not
    # hide the verdict behind a read that never ends
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "enable_gpu_health_check=true",
            str(SCRIPTS / "with_children.py"),
            "--end",
            "normal",
            "--pid-dir",
            str(pid_dir),
            "--listeners",
            str(listeners),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    log.close()
    children: list[int] = []
    try:
        children = rank_children(pid_dir, 2)
        proc.wait(timeout=90)
        out = (tmp_path / "launcher.log").read_text(errors="replace")
        assert proc.returncode == 0, out[-3000:]
        left = outliving(children)
        assert not left, f"a rank's child outlived the job (normal end): {left}\n{out[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    # the GPU health check passed before the ranks (which ran: their children above)
    assert "1 GPU(s) ok via nvidia-smi" in out, out[-3000:]
    # --standalone: the launcher's rendezvous store and the round's worker store at least,
    # every one on loopback
    found = json.loads(listeners.read_text())
    assert len(found) >= 2, found
    assert all(_loopback(str(s["local"])) for s in found), found
