"""NVRx's own RankMonitorClient against rankguard's bridge, in one process."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

import pytest

nvrx_ft = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance")

from rankguard.ft.config import FaultToleranceConfig  # noqa: E402
from rankguard.integrations.nvrx import (  # noqa: E402
    SOCKET_ENV,
    RankMonitorBridge,
    nvrx_config_from,
    serve_nvrx_client,
)
from rankguard.monitor.config import HeartbeatConfig  # noqa: E402
from rankguard.rank.timeline import ProgressTracker  # noqa: E402


class _Session:
    """Records what the bridge drives, over a real progress tracker."""

    def __init__(self) -> None:
        self.tracker = ProgressTracker()
        self.calls: list[tuple[str, Any]] = []

    def step_end(self, iteration: int | None = None) -> None:
        self.calls.append(("step_end", iteration))
        self.tracker.step_end(iteration)

    def set_phase(self, name: str) -> None:
        self.calls.append(("set_phase", name))
        self.tracker.set_phase(name)

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        self.calls.append(("checkpoint_start", checkpoint_id))
        self.tracker.checkpoint_start(checkpoint_id)

    def checkpoint_end(self) -> None:
        self.calls.append(("checkpoint_end", None))
        self.tracker.checkpoint_end()


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv("FT_LAUNCHER_IPC_SOCKET", raising=False)


def _ft(**kw: Any) -> FaultToleranceConfig:
    base: dict[str, Any] = {
        "rank_section_timeouts": {
            "setup": 600.0,
            "step": 180.0,
            "checkpointing": 420.0,
            "my_eval": 900.0,
        },
        "rank_out_of_section_timeout": 300.0,
    }
    base.update(kw)
    return FaultToleranceConfig(**base)


def _bridge(session: _Session, tmp_path: Path) -> RankMonitorBridge:
    cfg = nvrx_config_from(_ft(), HeartbeatConfig(enabled=True))
    return RankMonitorBridge(session, cfg, rank=0, socket_dir=tmp_path / "sock").start()


@pytest.mark.timeout(30)
def test_megatron_sequence_of_calls(rank_env: None, tmp_path: Path) -> None:
    (tmp_path / "sock").mkdir()
    session = _Session()
    bridge = _bridge(session, tmp_path)
    try:
        assert os.environ[SOCKET_ENV] == str(bridge.path)
        assert stat.S_IMODE(os.stat(bridge.socket_dir).st_mode) == 0o700
        client = nvrx_ft.RankMonitorClient()
        client.init_workload_monitoring()
        # the config in force reached the client
        # (NVRx refuses a section that has no timeout in the config: my_eval has one)
        assert client.section_timeouts.section == {
            "setup": 600.0,
            "step": 180.0,
            "checkpointing": 420.0,
            "my_eval": 900.0,
        }
        assert client.section_timeouts.out_of_section == 300.0
        client.start_section("setup")
        client.end_section("setup")
        for _ in range(3):
            client.start_section("step")
            client.end_section("step")
        client.start_section("checkpointing")
        assert session.tracker.checkpoint_active
        client.end_section("checkpointing")
        assert not session.tracker.checkpoint_active
        client.start_section("my_eval")
        assert session.tracker.phase == "my_eval"
        client.end_section("my_eval")
        client.send_heartbeat()
        client.send_heartbeat()
        block = bridge.heartbeat_block()
        assert block is not None
        assert block.heartbeats == 2
        assert block.open_sections == ()
        json.dumps(block.to_dict())  # rides in heartbeat records
        state = client.state_dict()
        assert "current_timeouts" in state
        client.shutdown_workload_monitoring()
    finally:
        bridge.close()
    names = [c[0] for c in session.calls]
    # setup and step are rankguard's own phases: no call; a save is a checkpoint phase;
    # another section a phase of its name; a heartbeat progress
    assert names == [
        "checkpoint_start",
        "checkpoint_end",
        "set_phase",
        "set_phase",
        "step_end",
        "step_end",
    ]
    assert session.calls[2] == ("set_phase", "my_eval")
    assert not bridge.path.exists()
    assert SOCKET_ENV not in os.environ


@pytest.mark.timeout(30)
def test_rank_0_says_the_timeouts_as_nvrx_prints_them(
    rank_env: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sock").mkdir()
    bridge = _bridge(_Session(), tmp_path)
    try:
        client = nvrx_ft.RankMonitorClient()
        client.init_workload_monitoring()
        client.shutdown_workload_monitoring()
    finally:
        bridge.close()
    err = capfd.readouterr().err
    sections = str(client.section_timeouts)  # NVRx's own rendering, its field order
    assert sections.startswith("SectionTimeouts(out_of_section=300.00, sections=[setup=600.00")
    assert f"[FaultTolerance] rank monitor serving the client (rankguard): Timeouts={sections}" in (
        err
    )
    assert f"[RankMonitorServer] section timeouts: {sections} heartbeat timeouts: " in err
    assert "HeartbeatTimeouts(initial=" in err


@pytest.mark.timeout(30)
def test_calculated_timeouts_are_recorded_and_warned(
    rank_env: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.distributed as dist

    (tmp_path / "sock").mkdir()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    session = _Session()
    bridge = _bridge(session, tmp_path)
    try:
        client = nvrx_ft.RankMonitorClient()
        client.init_workload_monitoring()
        client.start_section("setup")
        time.sleep(0.01)
        client.end_section("setup")
        for _ in range(3):
            client.start_section("step")
            time.sleep(0.002)
            client.end_section("step")
        with caplog.at_level("WARNING", logger="rankguard.integrations.nvrx"):
            assert client.calculate_and_set_section_timeouts(
                selected_sections=["setup", "step"], calc_out_of_section=False
            )
        calc = bridge.heartbeat_block().calculated_timeouts  # type: ignore[union-attr]
        assert set(calc["section"]["calculated_sections"]) == {"setup", "step"}
        assert calc["section"]["section"]["step"] < 180.0
        assert any("keeps this launch's timeouts" in r.getMessage() for r in caplog.records)
        # NVRx's state dict, as Megatron writes it to <save>/ft_state.json
        state = client.state_dict()
        assert state["current_timeouts"]["section"]["calculated_sections"]
        client.shutdown_workload_monitoring()
    finally:
        bridge.close()
        dist.destroy_process_group()


@pytest.mark.timeout(30)
def test_open_sections_are_closed_when_the_bridge_closes(rank_env: None, tmp_path: Path) -> None:
    (tmp_path / "sock").mkdir()
    session = _Session()
    bridge = _bridge(session, tmp_path)
    client = nvrx_ft.RankMonitorClient()
    client.init_workload_monitoring()
    client.start_section("checkpointing")
    assert session.tracker.checkpoint_active
    client.shutdown_workload_monitoring()
    bridge.close()
    assert not session.tracker.checkpoint_active


@pytest.mark.timeout(30)
def test_another_user_is_refused(rank_env: None, tmp_path: Path) -> None:
    (tmp_path / "sock").mkdir()
    bridge = _bridge(_Session(), tmp_path)
    try:
        assert bridge._same_user(_connected(bridge.path))
    finally:
        bridge.close()


def _connected(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


@pytest.mark.timeout(30)
def test_serve_only_when_asked_and_not_twice(
    rank_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _Session()
    assert serve_nvrx_client(session, _ft(), HeartbeatConfig(), rank=0, enabled=False) is None
    monkeypatch.setenv(SOCKET_ENV, "/nonexistent/already-served.sock")
    assert serve_nvrx_client(session, _ft(), HeartbeatConfig(), rank=0) is None
    monkeypatch.delenv(SOCKET_ENV)
    bridge = serve_nvrx_client(session, _ft(), HeartbeatConfig(), rank=0)
    assert bridge is not None
    try:
        assert Path(os.environ[SOCKET_ENV]).exists()
    finally:
        bridge.close()
    assert not bridge.socket_dir.exists()


@pytest.mark.timeout(30)
def test_unsupported_version_is_one_line_and_no_socket(
    rank_env: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import rankguard.integrations.nvrx as mod

    monkeypatch.setattr(mod, "nvrx_version", lambda: (0, 2, 0))
    with caplog.at_level("WARNING", logger="rankguard.integrations.nvrx"):
        assert serve_nvrx_client(_Session(), _ft(), HeartbeatConfig(), rank=0) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "0.2.0" in lines[0]
    assert SOCKET_ENV not in os.environ
    client = nvrx_ft.RankMonitorClient()
    with pytest.raises(nvrx_ft.RankMonitorClientError):
        client.init_workload_monitoring()
