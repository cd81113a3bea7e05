"""Collector: backend choice, snapshot file, baseline, thread lifecycle, rank -> GPU."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rankguard.health import (
    HealthCollector,
    collect_gpu_health,
    gpu_for_rank,
    health_file_name,
)
from rankguard.health import collector as collector_mod
from rankguard.monitor.config import HardwareHealthConfig
from tests.factories import load_fake_pynvml

SNAPSHOT_KEYS = {
    "schema_version",
    "source",
    "status",
    "error",
    "hostname",
    "collected_wall_time",
    "gpus",
}

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def no_backends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """Neither pynvml nor nvidia-smi, whatever this machine has."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    (empty / "python3").symlink_to(sys.executable)  # for the fake's ``env python3`` shebang
    monkeypatch.setenv("PATH", str(empty))
    return monkeypatch


@pytest.fixture
def nvml(no_backends: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A fake pynvml; returns a ``configure(gpus, **top)`` function with ``make_gpu``."""
    module = load_fake_pynvml()
    no_backends.setitem(sys.modules, "pynvml", module)
    config = tmp_path / "nvml.json"
    no_backends.setenv(module.CONFIG_ENV, str(config))

    def configure(gpus: list[dict[str, Any]], **top: Any) -> ModuleType:
        module.write_config(config, gpus, **top)
        return module

    configure.make_gpu = module.make_gpu  # type: ignore[attr-defined]
    configure([])
    return configure


@pytest.fixture
def smi(no_backends: pytest.MonkeyPatch, fake_smi: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The fake nvidia-smi first on PATH, after no_backends emptied it."""
    return fake_smi


def _cfg(interval_s: float = 60.0) -> HardwareHealthConfig:
    return HardwareHealthConfig(enabled=True, interval_s=interval_s, command_timeout_s=0.01)


def test_nothing_available_is_unavailable(no_backends: pytest.MonkeyPatch) -> None:
    snap = collect_gpu_health(command_timeout_s=1)
    assert set(snap) == SNAPSHOT_KEYS
    assert (snap["source"], snap["status"], snap["gpus"]) == ("none", "unavailable", [])
    assert snap["hostname"] == socket.gethostname() and snap["schema_version"] == 1
    assert snap["collected_wall_time"].endswith("+00:00")


def test_nvml_is_preferred(nvml: Any, smi: pytest.MonkeyPatch) -> None:
    nvml([nvml.make_gpu(0), nvml.make_gpu(1, ecc_uncorrected=2)])
    snap = collect_gpu_health(command_timeout_s=5)
    assert (snap["source"], snap["status"], snap["error"]) == ("nvml", "unhealthy", None)
    assert [g["health"] for g in snap["gpus"]] == ["ok", "unhealthy"]
    assert snap["gpus"][1]["problems"] == ["ecc_uncorrected_volatile=2"]


def test_falls_back_to_smi_when_nvml_fails(nvml: Any, smi: pytest.MonkeyPatch) -> None:
    nvml([], init_error="Unknown")
    snap = collect_gpu_health(command_timeout_s=5)
    assert (snap["source"], snap["status"], len(snap["gpus"])) == ("nvidia-smi", "ok", 2)
    assert collect_gpu_health(command_timeout_s=5, prefer="nvml")["status"] == "error"


def test_nvml_error_without_smi_is_error(nvml: Any) -> None:
    nvml([], init_error="NoPermission")
    snap = collect_gpu_health(command_timeout_s=1)
    assert (snap["source"], snap["status"]) == ("nvml", "error")
    assert "Insufficient Permissions" in snap["error"]


def test_smi_timeout_is_error_snapshot(smi: pytest.MonkeyPatch) -> None:
    smi.setenv("FAKE_SMI_SLEEP", "30")
    snap = collect_gpu_health(command_timeout_s=0.3, prefer="nvidia-smi")
    assert (snap["source"], snap["status"]) == ("nvidia-smi", "error")
    assert "timed out" in snap["error"]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="prefer"):
        collect_gpu_health(command_timeout_s=1, prefer="dcgm")
    with pytest.raises(ValueError, match="command_timeout_s"):
        collect_gpu_health(command_timeout_s=0)


def test_collect_once_writes_file_atomically(
    nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml([nvml.make_gpu(0)])
    writes: list[Path] = []
    real_write = collector_mod.atomic_write_json

    def spy(path: Any, obj: Any) -> None:
        writes.append(Path(path))
        real_write(path, obj)

    monkeypatch.setattr(collector_mod, "atomic_write_json", spy)
    run_dir = tmp_path / "run"
    coll = HealthCollector(_cfg(), run_dir, node_rank=3)
    snap = coll.collect_once()
    target = run_dir / health_file_name(3)
    assert writes == [target] and coll.path == target and coll.latest is snap
    on_disk = json.loads(target.read_text())
    assert set(on_disk) == SNAPSHOT_KEYS | {"node_rank"} and on_disk["node_rank"] == 3
    assert on_disk["status"] == "ok" and on_disk["gpus"][0]["health"] == "ok"
    assert sorted(p.name for p in run_dir.iterdir()) == ["gpu_health_node_3.json"]


def test_corrected_ecc_increase_over_first_sample(nvml: Any, tmp_path: Path) -> None:
    nvml([nvml.make_gpu(0, ecc_corrected=4), nvml.make_gpu(1, ecc_corrected=0)])
    coll = HealthCollector(_cfg(), tmp_path, node_rank=0)
    assert coll.collect_once()["status"] == "ok"  # a non-zero first sample is the baseline
    nvml([nvml.make_gpu(0, ecc_corrected=6), nvml.make_gpu(1, ecc_corrected=0)])
    snap = coll.collect_once()
    assert snap["status"] == "warning"
    assert snap["gpus"][0]["problems"] == ["ecc_corrected_volatile_increase=2"]
    assert snap["gpus"][1]["health"] == "ok"


def test_exception_becomes_error_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(**_: Any) -> dict[str, Any]:
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(collector_mod, "collect_gpu_health", boom)
    coll = HealthCollector(_cfg(), tmp_path, node_rank=1)
    snap = coll.collect_once()
    assert snap["status"] == "error" and "probe exploded" in snap["error"]
    assert coll.errors == 1 and (tmp_path / "gpu_health_node_1.json").exists()


def test_thread_collects_at_once_and_stops_promptly(nvml: Any, tmp_path: Path) -> None:
    nvml([nvml.make_gpu(0)])
    coll = HealthCollector(_cfg(interval_s=60.0), tmp_path, node_rank=0)
    coll.start()
    deadline = time.monotonic() + 5
    while coll.latest is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert coll.latest is not None and coll.latest["status"] == "ok"
    started = time.monotonic()
    coll.stop(timeout=5)
    assert time.monotonic() - started < 1.0  # the 60 s wait is interrupted
    assert coll.collections == 1


def test_thread_repeats_every_interval(nvml: Any, tmp_path: Path) -> None:
    nvml([nvml.make_gpu(0)])
    coll = HealthCollector(_cfg(interval_s=0.05), tmp_path, node_rank=0)
    coll.start()
    coll.start()  # idempotent
    deadline = time.monotonic() + 5
    while coll.collections < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    coll.stop()
    assert coll.collections >= 3
    assert not any(t.name.startswith("rankguard-gpu-health") for t in threading.enumerate())


SNAP = {
    "hostname": "node-a",
    "gpus": [
        {"index": 0, "uuid": "GPU-11111111-aaaa"},
        {"index": 1, "uuid": "GPU-22222222-bbbb"},
    ],
}


@pytest.mark.parametrize(
    ("token", "ordinal", "expected_index"),
    [
        ("GPU-22222222-bbbb", 0, 1),
        ("gpu-22222222-BBBB", None, 1),
        ("GPU-2222", 0, 1),  # unique prefix, as CUDA_VISIBLE_DEVICES allows
        ("GPU-", 0, None),  # ambiguous prefix
        ("GPU-99999999", 0, None),
        ("MIG-33333333", 0, None),
        ("1", 0, 1),
        ("7", 0, None),
        (None, 1, 1),
        ("", 0, 0),
        (None, None, None),
        ("weird", 0, None),
    ],
)
def test_gpu_for_rank(token: str | None, ordinal: int | None, expected_index: int | None) -> None:
    gpu = gpu_for_rank(SNAP, "node-a", token, ordinal)
    assert (None if gpu is None else gpu["index"]) == expected_index


def test_gpu_for_rank_other_host_or_no_snapshot() -> None:
    assert gpu_for_rank(SNAP, "node-b", "GPU-22222222-bbbb", 1) is None
    assert gpu_for_rank(None, "node-a", "0", 0) is None
