"""The hand-over between two worker groups: old pids gone and their GPU memory freed
before new workers start (bounded), with NVML's per-process lists (fake NVML)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankguard.launcher.handover import gpu_memory_by_pid, wait_for_handover
from tests.factories import load_fake_pynvml

_fake_module = load_fake_pynvml()  # its helpers: make_gpu, write_config


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def test_returns_at_once_when_everything_is_gone() -> None:
    result = wait_for_handover(
        [11, 12], timeout_s=5, running=lambda p: False, gpu_memory=lambda: {99: 1 << 30}
    )
    assert result.ok and result.running == () and result.gpu_bytes == {}


def test_waits_for_gpu_memory_of_an_exited_pid() -> None:
    clock = _Clock()
    held = {11: 2 << 30}
    polls = []

    def memory() -> dict[int, int]:
        polls.append(clock.t)
        if clock.t >= 1.0:
            held.clear()  # the driver released it
        return dict(held)

    result = wait_for_handover(
        [11],
        timeout_s=10,
        poll_s=0.25,
        running=lambda p: False,
        gpu_memory=memory,
        clock=clock,
        sleep=clock.advance,
    )
    assert result.ok and 1.0 <= result.waited_s < 1.3
    assert len(polls) >= 4


def test_bounded_and_says_what_is_left(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    with caplog.at_level("WARNING", logger="rankguard.launcher.handover"):
        result = wait_for_handover(
            [11, 12],
            timeout_s=2,
            poll_s=0.5,
            running=lambda p: p == 12,
            gpu_memory=lambda: {11: 3 << 20, 40: 1},
            clock=clock,
            sleep=clock.advance,
        )
    assert not result.ok and 2 <= result.waited_s < 2.6
    assert result.running == (12,) and result.gpu_bytes == {11: 3 << 20}
    (line,) = [r.getMessage() for r in caplog.records]
    assert "pids 12 still running" in line and "11: 3 MiB" in line


def test_without_nvml_only_processes_are_waited_for() -> None:
    calls = []

    def memory() -> None:
        calls.append(1)
        return None

    result = wait_for_handover([5], timeout_s=1, running=lambda p: False, gpu_memory=memory)
    assert result.ok and calls == [1]


def test_fake_nvml_process_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        _fake_module.make_gpu(0, processes=[{"pid": 11, "usedGpuMemory": 5 << 20}]),
        _fake_module.make_gpu(
            1,
            processes=[
                {"pid": 11, "usedGpuMemory": 1 << 20},
                {"pid": 12, "usedGpuMemory": None},  # the driver does not say how much
            ],
        ),
    ]
    monkeypatch.setenv(
        "FAKE_NVML_CONFIG", str(_fake_module.write_config(tmp_path / "c.json", gpus))
    )
    nvml = load_fake_pynvml()
    assert gpu_memory_by_pid(nvml) == {11: 6 << 20, 12: 0}
    assert nvml.INIT_CALLS == nvml.SHUTDOWN_CALLS == 1


def test_no_driver_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _fake_module.write_config(tmp_path / "c.json", [], init_error="DriverNotLoaded")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    assert gpu_memory_by_pid(load_fake_pynvml()) is None


@pytest.mark.timeout(30)
def test_real_process_reaped_late_is_waited_for() -> None:
    """A real child that exits only after a while: the hand-over returns once it is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    try:
        t0 = time.monotonic()
        result = wait_for_handover([proc.pid], timeout_s=10, gpu_memory=lambda: None)
        assert result.ok
        assert 0.3 < time.monotonic() - t0 < 9
    finally:
        proc.kill()
        proc.wait()
