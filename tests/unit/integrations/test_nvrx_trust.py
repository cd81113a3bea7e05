"""The NVRx client socket is the job user's only: a peer of another uid is closed
before anything it sent is read (NVRx's framing unpickles), and bytes that do not
unpickle end that one connection, not the bridge."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import time
from pathlib import Path
from typing import Any

import pytest

nvrx_ft = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance")

from rankguard.ft.config import FaultToleranceConfig  # noqa: E402
from rankguard.integrations import nvrx  # noqa: E402
from rankguard.integrations.nvrx import SOCKET_ENV, RankMonitorBridge  # noqa: E402
from rankguard.monitor.config import HeartbeatConfig  # noqa: E402
from rankguard.rank.timeline import ProgressTracker  # noqa: E402

pytestmark = pytest.mark.timeout(30)


class _Session:
    def __init__(self) -> None:
        self.tracker = ProgressTracker()

    def step_end(self, iteration: int | None = None) -> None:
        self.tracker.step_end(iteration)

    def set_phase(self, name: str) -> None:
        self.tracker.set_phase(name)

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        self.tracker.checkpoint_start(checkpoint_id)

    def checkpoint_end(self) -> None:
        self.tracker.checkpoint_end()


class _Planted:
    """Unpickling this creates a directory: the proof that a payload ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


@pytest.fixture
def bridge(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv("FT_LAUNCHER_IPC_SOCKET", raising=False)
    (tmp_path / "sock").mkdir()
    cfg = nvrx.nvrx_config_from(FaultToleranceConfig(), HeartbeatConfig(enabled=True))
    b = RankMonitorBridge(_Session(), cfg, rank=0, socket_dir=tmp_path / "sock").start()
    yield b
    b.close()


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _send(path: Path, data: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5.0)
    s.connect(str(path))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed at once
        s.sendall(data)
    return s


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _wait(cond: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_peer_of_another_uid_is_closed_before_anything_is_read(
    bridge: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.getuid()
    monkeypatch.setattr(nvrx.os, "getuid", lambda: real + 1)  # the peer is now "another"
    marker = tmp_path / "payload-ran"
    s = _send(bridge.path, _frame(pickle.dumps(_Planted(marker))))
    assert _closed(s)
    assert _wait(lambda: bridge.refused == 1)
    assert bridge.connections == 0
    time.sleep(0.2)
    assert not marker.exists()
    s.close()


def test_bytes_that_do_not_unpickle_end_one_connection_only(bridge: Any) -> None:
    bad = _send(bridge.path, _frame(b"\x80\x05not a pickle at all"))
    assert _closed(bad)
    bad.close()
    client = nvrx_ft.RankMonitorClient()
    client.init_workload_monitoring()  # a new connection is served as before
    client.send_heartbeat()
    assert _wait(lambda: bridge.heartbeats == 1)
    assert bridge.connections == 2
    client.shutdown_workload_monitoring()
