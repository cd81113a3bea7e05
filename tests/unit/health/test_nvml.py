"""NVML backend against the fake ``pynvml`` in tests/fakes/fake_nvml (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rankguard.health.nvml import collect_nvml
from rankguard.health.schema import GPU_FIELDS, NodeStatus
from tests.factories import load_fake_pynvml

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Install a fresh fake ``pynvml``; returns a ``configure(gpus, **top)`` function."""
    module = load_fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    config = tmp_path / "nvml.json"
    monkeypatch.setenv(module.CONFIG_ENV, str(config))

    def configure(gpus: list[dict[str, Any]], **top: Any) -> ModuleType:
        module.write_config(config, gpus, **top)
        return module

    configure.make_gpu = module.make_gpu  # type: ignore[attr-defined]
    return configure


def test_reads_every_field_with_units_converted(fake_nvml: Any) -> None:
    mod = fake_nvml([fake_nvml.make_gpu(0), fake_nvml.make_gpu(1)])
    result = collect_nvml()
    assert result.status is NodeStatus.OK and result.source == "nvml" and result.error is None
    assert [g["index"] for g in result.gpus] == [0, 1]
    gpu = result.gpus[0]
    assert tuple(gpu) == GPU_FIELDS
    assert gpu["uuid"] == "GPU-00000000-1111-2222-3333-444455556666"
    assert gpu["pci_bus_id"] == "00000000:18:00.0"  # bytes from ctypes decoded
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["driver_version"] == "550.54.15"
    assert (gpu["temperature_c"], gpu["utilization_gpu_pct"]) == (34, 97)
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (40960, 81559)
    assert (gpu["power_draw_w"], gpu["power_limit_w"]) == (512.35, 700.0)
    assert gpu["thermal_slowdown"] is False
    assert (gpu["ecc_corrected_volatile"], gpu["ecc_uncorrected_volatile"]) == (0, 0)
    assert gpu["retired_pages_pending"] is False
    assert (gpu["remapped_rows_pending"], gpu["remapped_rows_failure"]) == (False, False)
    assert gpu["recovery_action"] == "none"
    assert gpu["query_error"] is None
    assert mod.INIT_CALLS == mod.SHUTDOWN_CALLS == 1


def test_not_supported_and_failing_calls_become_none(fake_nvml: Any) -> None:
    unsupported = [
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetGpuRecoveryAction",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]
    errors = {"nvmlDeviceGetTemperature": "Unknown", "nvmlDeviceGetUUID": "NoPermission"}
    fake_nvml([fake_nvml.make_gpu(0, not_supported=unsupported, errors=errors)])
    gpu = collect_nvml().gpus[0]
    for key in (
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "retired_pages_pending",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "power_draw_w",
        "recovery_action",
        "thermal_slowdown",
        "temperature_c",
        "uuid",
    ):
        assert gpu[key] is None, key
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["memory_total_mib"] == 81559


@pytest.mark.parametrize(
    ("mask", "expected"), [(0x0, False), (0x1, False), (0x4, False), (0x20, True), (0x40, True)]
)
def test_thermal_slowdown_bits(fake_nvml: Any, mask: int, expected: bool) -> None:
    fake_nvml([fake_nvml.make_gpu(0, clocks_reasons=mask)])
    assert collect_nvml().gpus[0]["thermal_slowdown"] is expected


def test_old_driver_falls_back_to_throttle_reasons(fake_nvml: Any) -> None:
    fake_nvml([fake_nvml.make_gpu(0, clocks_reasons=0x40)], clocks_api="throttle")
    assert collect_nvml().gpus[0]["thermal_slowdown"] is True


@pytest.mark.parametrize("api", ["function", "field"])
@pytest.mark.parametrize(
    ("code", "name"),
    [(0, "none"), (1, "gpu_reset"), (2, "node_reboot"), (3, "drain_p2p"), (4, "drain_and_reset")],
)
def test_recovery_action_mapping(fake_nvml: Any, api: str, code: int, name: str) -> None:
    fake_nvml([fake_nvml.make_gpu(0, recovery_action=code)], recovery_api=api)
    assert collect_nvml().gpus[0]["recovery_action"] == name


def test_recovery_action_unknown_code_and_missing_api(fake_nvml: Any) -> None:
    fake_nvml([fake_nvml.make_gpu(0, recovery_action=99)])
    assert collect_nvml().gpus[0]["recovery_action"] == "unknown_99"
    fake_nvml([fake_nvml.make_gpu(0, recovery_action=1)], recovery_api="none")
    assert collect_nvml().gpus[0]["recovery_action"] is None


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded"])
def test_no_library_or_driver_is_unavailable(fake_nvml: Any, error: str) -> None:
    mod = fake_nvml([], init_error=error)
    result = collect_nvml()
    assert result.status is NodeStatus.UNAVAILABLE and result.gpus == []
    assert "nvmlInit" in (result.error or "")
    assert mod.SHUTDOWN_CALLS == 0  # never shut down what did not start


def test_other_init_failure_is_error(fake_nvml: Any) -> None:
    fake_nvml([], init_error="NoPermission")
    result = collect_nvml()
    assert result.status is NodeStatus.ERROR and "Insufficient Permissions" in (result.error or "")


def test_no_pynvml_module_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes ``import pynvml`` fail
    result = collect_nvml()
    assert result.status is NodeStatus.UNAVAILABLE and result.gpus == []


def test_zero_gpus_is_unavailable_and_shutdown_called(fake_nvml: Any) -> None:
    mod = fake_nvml([])
    assert collect_nvml().status is NodeStatus.UNAVAILABLE
    assert mod.INIT_CALLS == mod.SHUTDOWN_CALLS == 1


def test_enumeration_failure_is_error_and_shutdown_called(fake_nvml: Any) -> None:
    mod = fake_nvml([fake_nvml.make_gpu(0)], count_error="Unknown")
    result = collect_nvml()
    assert result.status is NodeStatus.ERROR and "nvmlDeviceGetCount" in (result.error or "")
    assert mod.SHUTDOWN_CALLS == 1


def test_lost_gpu_is_reported_not_raised(fake_nvml: Any) -> None:
    fake_nvml([fake_nvml.make_gpu(0), fake_nvml.make_gpu(1, handle_error="GpuIsLost")])
    result = collect_nvml()
    assert result.status is NodeStatus.OK
    lost = result.gpus[1]
    assert lost["index"] == 1 and "GPU is lost" in lost["query_error"]
    assert lost["uuid"] is None and result.gpus[0]["query_error"] is None
