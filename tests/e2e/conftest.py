"""Helpers for end-to-end runs of the real ``rankguard`` CLI on loopback with gloo."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankguard.util.procs import pid_running
from tests.factories import read_jsonl as read_jsonl
from tests.factories import read_status as read_status

SCRIPTS = Path(__file__).parent / "scripts"

# Short timeouts so that a fault is reported within seconds (same as the demo's).
FAST = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.initial_process_timeout_s=30",
    "heartbeat.process_timeout_s=3",
    "heartbeat.initial_progress_timeout_s=60",
    "heartbeat.progress_timeout_s=4",
    "heartbeat.checkpoint_timeout_s=20",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rankguard_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rankguard.cli.main", *args]


def fast_sets() -> list[str]:
    out: list[str] = []
    for item in FAST:
        out += ["--set", item]
    return out


def node_run(
    node: int | None,
    port: int,
    run_id: str,
    log_dir: Path,
    *,
    nproc: int = 2,
    nnodes: int | str = 2,
    rdzv_conf: str | None = None,
) -> list[str]:
    """``run`` as node ``node`` of ``nnodes`` agents (a count or torch elastic's
    ``MIN:MAX``) on loopback (own log dir), FAST settings; ``node`` None: no
    ``--node-rank`` (the rendezvous numbers the nodes); ``rdzv_conf``: ``--rdzv-conf``."""
    return [
        "run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        *([] if node is None else ["--node-rank", str(node)]),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        *([] if rdzv_conf is None else ["--rdzv-conf", rdzv_conf]),
        "--log-dir",
        str(log_dir),
        *fast_sets(),
    ]


def run_nodes(
    cmds: dict[int, list[str]],
    timeout_s: float,
    envs: dict[int, dict[str, str]] | None = None,
    cpus: dict[int, list[int]] | None = None,
) -> tuple[dict[int, str], dict[int, int | None]]:
    """Run one command per node at once; each node's output and exit code. ``envs``:
    variables added to one node's environment (a fake GPU on one "node"); ``cpus``: the
    CPUs a node's launcher may run on (what ``--nproc-per-node auto`` counts)."""

    def affinity(node: int) -> Callable[[], None] | None:
        if cpus is None or node not in cpus:
            return None
        return lambda: os.sched_setaffinity(0, cpus[node])

    procs = {
        node: subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(envs or {}).get(node, {})},
            preexec_fn=affinity(node),
        )
        for node, cmd in cmds.items()
    }
    outs: dict[int, str] = {}
    try:
        for node, proc in procs.items():
            outs[node], _ = proc.communicate(timeout=timeout_s)
    finally:
        # every node, not only the one that timed out: a launcher left running after a
        # failed test trains on beside the rest of the suite
        for proc in procs.values():
            proc.kill()
            proc.wait()
    return outs, {node: proc.returncode for node, proc in procs.items()}


def standalone_run(run_id: str, log_dir: Path, *, nproc: int = 2) -> list[str]:
    """``run`` on one node with ``nproc`` ranks, this run id and log dir, FAST settings."""
    return [
        "run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-id",
        run_id,
        "--log-dir",
        str(log_dir),
        *fast_sets(),
    ]


def run_rankguard(args: list[str], *, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        rankguard_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def heartbeat_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("rank_*_pid_*.heartbeat.jsonl"))


def leftover_processes(run_id: str) -> list[int]:
    """Live processes of run ``run_id``: the launcher (``--rdzv-id`` on its command line)
    and every worker (``RANKGUARD_RUN_ID`` in its environment); zombies do not count."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().split(b"\0")
        except OSError:
            continue
        if f"RANKGUARD_RUN_ID={run_id}".encode() in env or (
            run_id.encode() in cmd and b"pytest" not in b" ".join(cmd)
        ):
            found.append(int(entry))
    return found


def no_leftover_workers(run_id: str, wait_s: float = 5.0) -> bool:
    """No launcher or worker of ``run_id`` is still running (after up to ``wait_s``
    for processes that are being reaped)."""
    deadline = time.monotonic() + wait_s
    while leftover_processes(run_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def rank_children(pid_dir: Path, nproc: int, timeout_s: float = 60.0) -> list[int]:
    """The pids of the children ``scripts/with_children.py`` started, one per rank, once
    every rank wrote its ``child_<rank>`` file (within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = [pid_dir / f"child_{r}" for r in range(nproc)]
        if all(f.exists() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    pytest.fail(f"the ranks did not start their children: {sorted(os.listdir(pid_dir))}")


def outliving(pids: list[int], within_s: float = 10.0) -> list[int]:
    """The processes of ``pids`` still running (zombies do not count) after up to
    ``within_s``."""
    deadline = time.monotonic() + within_s
    left = [p for p in pids if pid_running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if pid_running(p)]
    return left


def kill_all(pids: list[int]) -> None:
    """SIGKILL what a failed test may have left running."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    return f"e2e-{request.node.name[:40]}-{os.getpid()}"


TRACKER_PACKAGES = ("tensorboard", "wandb", "mlflow")


@dataclass(frozen=True)
class HealthyRun:
    """One healthy 2-rank demo run that several tests read (each asserts its own part):
    20 steps, FLOPs measured, a perf window every 5 iterations, a checkpoint every 10,
    the node health checks on, TensorBoard, W&B (offline) and MLflow (a local SQLite
    store) as ``perf.trackers`` when their packages are installed, node 0's Prometheus
    exporter on an ephemeral port when prometheus-client is."""

    tmp: Path
    log_dir: Path
    run_id: str
    res: subprocess.CompletedProcess[str]
    trackers: bool
    mlflow_uri: str

    @property
    def out(self) -> str:
        return self.res.stdout + self.res.stderr

    @property
    def run_dir(self) -> Path:
        return self.log_dir / "heartbeat" / self.run_id


# The tests that read the healthy run share one worker (the run happens once).
HEALTHY_RUN = pytest.mark.xdist_group("healthy_run")


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> HealthyRun:
    tmp = tmp_path_factory.mktemp("healthy_run")
    run_id = f"e2e-healthy-run-{os.getpid()}"
    log_dir = tmp / "logs"
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    trackers = all(importlib.util.find_spec(name) is not None for name in TRACKER_PACKAGES)
    prometheus = importlib.util.find_spec("prometheus_client") is not None
    sets = [
        "perf.log_interval=5",
        "node_health.enabled=true",  # this machine's NIC and storage: no finding
        *(["perf.prometheus.enabled=true", "perf.prometheus.port=0"] if prometheus else []),
        *(
            [
                "perf.trackers=tensorboard,wandb,mlflow",
                f"perf.wandb.dir={tmp / 'wb'}",
                "perf.wandb.project=rankguard-e2e",
                f"perf.mlflow.tracking_uri={uri}",
                "perf.mlflow.experiment=rankguard-e2e",
            ]
            if trackers
            else []
        ),
    ]
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "WANDB_RUN_ID")
    }
    res = subprocess.run(
        rankguard_cmd(
            *standalone_run(run_id, log_dir),
            *[arg for item in sets for arg in ("--set", item)],
            "-m",
            "rankguard.demo.train",
            "--steps",
            "20",
            "--batch-size",
            "8",
            "--flops",
            "measured",
            "--checkpoint-every",
            "10",
            "--checkpoint-dir",
            str(tmp / "ckpt"),
        ),
        capture_output=True,
        text=True,
        timeout=200,
        stdin=subprocess.DEVNULL,
        # MLflow's artifacts and W&B's files stay in the run's directory
        cwd=tmp,
        env={**env, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    return HealthyRun(tmp, log_dir, run_id, res, trackers, uri)
