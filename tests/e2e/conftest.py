"""Helpers for end-to-end runs of the real ``rankguard`` CLI on loopback with gloo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_status(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "status.json").read_text())


def heartbeat_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("rank_*_pid_*.heartbeat.jsonl"))


def no_leftover_workers(marker: str) -> bool:
    """No process whose command line contains ``marker`` is still running."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return not any(marker in line and "pytest" not in line for line in out.splitlines())


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    return f"e2e-{request.node.name[:40]}-{os.getpid()}"
