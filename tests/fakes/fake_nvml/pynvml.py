"""A fake ``pynvml`` for tests on machines without a GPU.

It mirrors the subset of ``nvidia-ml-py`` that ``rankguard.health.nvml`` uses, with the
same names, error classes and value shapes (bytes for C strings, milliwatts, bytes of
memory, bit masks). What it reports comes from the JSON file named by the environment
variable ``FAKE_NVML_CONFIG``, re-read at every ``nvmlInit`` so a test can change the GPUs
between two collections::

    {
      "init_error": null,            # or "LibraryNotFound", "DriverNotLoaded", "Unknown"...
      "count_error": null,           # error raised by nvmlDeviceGetCount
      "driver_version": "550.54.15",
      "recovery_api": "function",    # "function", "field" (nvmlDeviceGetFieldValues), "none"
      "clocks_api": "event",         # "event" or "throttle" (old driver: event -> FunctionNotFound)
      "gpus": [make_gpu(0), ...]     # see make_gpu; per-GPU "not_supported": [function names],
                                     # "errors": {function name: error name}, "handle_error",
                                     # "xid_events": [79, ...] (delivered once to each event
                                     # set registered for the GPU, as NVML delivers XIDs)
    }

``INIT_CALLS`` and ``SHUTDOWN_CALLS`` count calls so tests can check the pairing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CONFIG_ENV = "FAKE_NVML_CONFIG"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    code = NVML_ERROR_UNKNOWN

    def __init__(self, value: int | None = None) -> None:
        self.value = self.code if value is None else value
        super().__init__(self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    return type(f"NVMLError_{name}", (NVMLError,), {"code": code})


NVMLError_Uninitialized = _error_class("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _error_class("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_DriverNotLoaded = _error_class("DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Timeout = _error_class("Timeout", NVML_ERROR_TIMEOUT)
NVMLError_Unknown = _error_class("Unknown", NVML_ERROR_UNKNOWN)

INIT_CALLS = 0
SHUTDOWN_CALLS = 0
_state: dict[str, Any] = {"config": None, "initialized": 0}


def make_gpu(index: int, **overrides: Any) -> dict[str, Any]:
    """A healthy H100 as NVML reports it; ``overrides`` replace any key."""
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index:08d}-1111-2222-3333-444455556666",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "temperature": 34 + index,
        "utilization": 97,
        "memory_used": 40960 * 1024 * 1024,
        "memory_total": 81559 * 1024 * 1024,
        "power_usage_mw": 512345,
        "power_limit_mw": 700000,
        "clocks_reasons": 0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages_pending": 0,
        "remapped_rows": [0, 0, 0, 0],
        "recovery_action": 0,
        "not_supported": [],
        "errors": {},
        "handle_error": None,
        "xid_events": [],
    }
    gpu.update(overrides)
    return gpu


def write_config(path: str | os.PathLike[str], gpus: list[dict[str, Any]], **top: Any) -> Path:
    """Write a config file for this fake and return its path."""
    config: dict[str, Any] = {
        "init_error": None,
        "count_error": None,
        "driver_version": "550.54.15",
        "recovery_api": "function",
        "clocks_api": "event",
        "gpus": gpus,
    }
    config.update(top)
    target = Path(path)
    target.write_text(json.dumps(config), encoding="utf-8")
    return target


def _raise(name: str) -> None:
    cls = globals().get(f"NVMLError_{name}", NVMLError_Unknown)
    raise cls()


def _config() -> dict[str, Any]:
    if _state["config"] is None:
        path = os.environ.get(CONFIG_ENV)
        _state["config"] = json.loads(Path(path).read_text()) if path else {"gpus": []}
    return _state["config"]


def _gpu(handle: Any, function: str) -> dict[str, Any]:
    if not _state["initialized"]:
        _raise("Uninitialized")
    gpu: dict[str, Any] = handle.gpu
    if function in gpu.get("not_supported", []):
        _raise("NotSupported")
    error = gpu.get("errors", {}).get(function)
    if error:
        _raise(error)
    return gpu


def nvmlInit() -> None:
    global INIT_CALLS
    INIT_CALLS += 1
    _state["config"] = None
    error = _config().get("init_error")
    if error:
        _raise(error)
    _state["initialized"] += 1


def nvmlShutdown() -> None:
    global SHUTDOWN_CALLS
    SHUTDOWN_CALLS += 1
    if not _state["initialized"]:
        _raise("Uninitialized")
    _state["initialized"] -= 1


def nvmlSystemGetDriverVersion() -> str:
    return str(_config().get("driver_version", "550.54.15"))


def nvmlDeviceGetCount() -> int:
    if not _state["initialized"]:
        _raise("Uninitialized")
    error = _config().get("count_error")
    if error:
        _raise(error)
    return len(_config()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    gpu = _config()["gpus"][index]
    if gpu.get("handle_error"):
        _raise(gpu["handle_error"])
    return SimpleNamespace(gpu=gpu)


def nvmlDeviceGetIndex(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetIndex")["index"])


def nvmlDeviceGetUUID(handle: Any) -> str:
    return str(_gpu(handle, "nvmlDeviceGetUUID")["uuid"])


def nvmlDeviceGetName(handle: Any) -> bytes:
    return str(_gpu(handle, "nvmlDeviceGetName")["name"]).encode()


def nvmlDeviceGetPciInfo(handle: Any) -> SimpleNamespace:
    return SimpleNamespace(busId=str(_gpu(handle, "nvmlDeviceGetPciInfo")["pci_bus_id"]).encode())


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    assert sensor == NVML_TEMPERATURE_GPU
    return int(_gpu(handle, "nvmlDeviceGetTemperature")["temperature"])


def nvmlDeviceGetUtilizationRates(handle: Any) -> SimpleNamespace:
    return SimpleNamespace(gpu=_gpu(handle, "nvmlDeviceGetUtilizationRates")["utilization"])


def nvmlDeviceGetMemoryInfo(handle: Any) -> SimpleNamespace:
    gpu = _gpu(handle, "nvmlDeviceGetMemoryInfo")
    used, total = int(gpu["memory_used"]), int(gpu["memory_total"])
    return SimpleNamespace(used=used, total=total, free=total - used)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetPowerUsage")["power_usage_mw"])


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_mw"])


def nvmlDeviceGetPowerManagementLimit(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetPowerManagementLimit")["power_limit_mw"])


def nvmlDeviceGetCurrentClocksEventReasons(handle: Any) -> int:
    if _config().get("clocks_api", "event") != "event":
        _raise("FunctionNotFound")
    return int(_gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")["clocks_reasons"])


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")["clocks_reasons"])


def nvmlDeviceGetTotalEccErrors(handle: Any, error_type: int, counter_type: int) -> int:
    assert counter_type == NVML_VOLATILE_ECC
    gpu = _gpu(handle, "nvmlDeviceGetTotalEccErrors")
    key = "ecc_corrected" if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else "ecc_uncorrected"
    return int(gpu[key])


def nvmlDeviceGetRetiredPagesPendingStatus(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")["retired_pages_pending"])


def nvmlDeviceGetRemappedRows(handle: Any) -> tuple[int, int, int, int]:
    corr, unc, pending, failure = _gpu(handle, "nvmlDeviceGetRemappedRows")["remapped_rows"]
    return int(corr), int(unc), int(pending), int(failure)


def nvmlDeviceGetFieldValues(handle: Any, field_ids: list[int]) -> list[SimpleNamespace]:
    gpu = _gpu(handle, "nvmlDeviceGetFieldValues")
    supported = _config().get("recovery_api") == "field"
    out = []
    for field_id in field_ids:
        known = supported and field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        out.append(
            SimpleNamespace(
                fieldId=field_id,
                nvmlReturn=NVML_SUCCESS if known else NVML_ERROR_NOT_SUPPORTED,
                valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                value=SimpleNamespace(uiVal=int(gpu["recovery_action"]) if known else 0),
            )
        )
    return out


def _recovery_action(handle: Any) -> int:
    return int(_gpu(handle, "nvmlDeviceGetGpuRecoveryAction")["recovery_action"])


def __getattr__(name: str) -> Any:
    # Only newer nvidia-ml-py releases define nvmlDeviceGetGpuRecoveryAction.
    if name == "nvmlDeviceGetGpuRecoveryAction" and _config().get("recovery_api") == "function":
        return _recovery_action
    raise AttributeError(name)


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[SimpleNamespace]:
    """The GPU's ``processes`` entry: [{"pid": 123, "usedGpuMemory": bytes}, ...]."""
    gpu = _gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [SimpleNamespace(**p) for p in gpu.get("processes", [])]


nvmlEventTypeXidCriticalError = 0x0000000000000008


def nvmlEventSetCreate() -> SimpleNamespace:
    if not _state["initialized"]:
        _raise("Uninitialized")
    return SimpleNamespace(pending=[], freed=False)


def nvmlDeviceRegisterEvents(handle: Any, event_types: int, event_set: Any) -> None:
    gpu = _gpu(handle, "nvmlDeviceRegisterEvents")
    if event_types & nvmlEventTypeXidCriticalError:
        event_set.pending.extend(
            SimpleNamespace(device=handle, eventType=nvmlEventTypeXidCriticalError, eventData=x)
            for x in gpu.get("xid_events", [])
        )


def nvmlEventSetWait_v2(event_set: Any, timeout_ms: int) -> SimpleNamespace:
    if event_set.freed:
        _raise("Uninitialized")
    if not event_set.pending:
        _raise("Timeout")
    return event_set.pending.pop(0)


def nvmlEventSetFree(event_set: Any) -> None:
    event_set.freed = True
