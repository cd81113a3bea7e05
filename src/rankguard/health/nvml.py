"""GPU health through NVML (``nvidia-ml-py``, imported as ``pynvml``).

NVML is preferred over parsing ``nvidia-smi``: it is an in-process library call (no fork,
no text format that changes between driver releases) and it tells "not supported on this
GPU" apart from a real failure by exception type. ``pynvml`` is imported lazily so a CPU
node, or a node whose driver is missing, pays nothing and reports ``unavailable``.

Every per-field call is guarded: a field the GPU or driver does not support (older
architectures have no row remapping, consumer boards no ECC, old drivers no recovery
action) becomes ``None``; it never aborts the collection. ``nvmlShutdown`` is always
called after a successful ``nvmlInit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from rankguard.health.schema import CollectionResult, NodeStatus, empty_gpu
from rankguard.schema.jsontypes import JsonObject

__all__ = ["RECOVERY_ACTIONS", "SOURCE", "XidWatcher", "collect_nvml"]

logger = logging.getLogger(__name__)

SOURCE = "nvml"

#: ``nvmlDeviceGpuRecoveryAction_t`` values (NVML 570+), as written in the health file.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

_MIB = 1024 * 1024
# Fallbacks for pynvml releases that lack the named constants.
_SW_THERMAL_BIT = 0x20
_HW_THERMAL_BIT = 0x40
_FI_GPU_RECOVERY_ACTION = 230
_UNAVAILABLE_ERRORS = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")
_UNAVAILABLE_CODES = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def collect_nvml() -> CollectionResult:
    """Read every GPU on this node through NVML.

    Returns ``unavailable`` when ``pynvml`` cannot be imported, the NVML library is not
    found, the driver is not loaded or there is no GPU; ``error`` when NVML is present but
    fails to initialise or enumerate devices.
    """
    try:
        import pynvml
    except ImportError as exc:
        return CollectionResult(SOURCE, NodeStatus.UNAVAILABLE, error=f"pynvml: {exc}")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        status = NodeStatus.UNAVAILABLE if _is_unavailable(pynvml, exc) else NodeStatus.ERROR
        return CollectionResult(SOURCE, status, error=f"nvmlInit: {exc}")
    except OSError as exc:  # a broken libnvidia-ml.so that fails to load
        return CollectionResult(SOURCE, NodeStatus.UNAVAILABLE, error=f"nvmlInit: {exc}")
    try:
        return _collect_devices(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            logger.warning("nvmlShutdown failed: %s", exc)


def _collect_devices(nvml: ModuleType) -> CollectionResult:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        return CollectionResult(SOURCE, NodeStatus.ERROR, error=f"nvmlDeviceGetCount: {exc}")
    if count == 0:
        return CollectionResult(SOURCE, NodeStatus.UNAVAILABLE, error="NVML reports no GPU")
    driver = _text(_get(nvml, nvml.nvmlSystemGetDriverVersion))
    gpus: list[JsonObject] = []
    for i in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
        except nvml.NVMLError as exc:
            logger.warning("NVML cannot address GPU %d: %s", i, exc)
            gpu = empty_gpu(i)
            gpu["driver_version"] = driver
            gpu["query_error"] = f"nvmlDeviceGetHandleByIndex: {exc}"
            gpus.append(gpu)
            continue
        gpus.append(_read_gpu(nvml, handle, i, driver))
    return CollectionResult(SOURCE, NodeStatus.OK, gpus=gpus)


def _read_gpu(nvml: ModuleType, handle: Any, fallback_index: int, driver: str | None) -> JsonObject:
    gpu = empty_gpu(fallback_index)
    index = _get(nvml, nvml.nvmlDeviceGetIndex, handle)
    gpu["index"] = int(index) if index is not None else fallback_index
    gpu["uuid"] = _text(_get(nvml, nvml.nvmlDeviceGetUUID, handle))
    pci = _get(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    gpu["pci_bus_id"] = _text(getattr(pci, "busId", None))
    gpu["name"] = _text(_get(nvml, nvml.nvmlDeviceGetName, handle))
    gpu["driver_version"] = driver
    temp = _get(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    gpu["temperature_c"] = _int(temp)
    util = _get(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    gpu["utilization_gpu_pct"] = _int(getattr(util, "gpu", None))
    mem = _get(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    if mem is not None:
        gpu["memory_used_mib"] = int(mem.used) // _MIB
        gpu["memory_total_mib"] = int(mem.total) // _MIB
    gpu["power_draw_w"] = _milliwatts(_get(nvml, nvml.nvmlDeviceGetPowerUsage, handle))
    limit = _get_optional(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    if limit is None:
        limit = _get_optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
    gpu["power_limit_w"] = _milliwatts(limit)
    gpu["thermal_slowdown"] = _thermal_slowdown(nvml, handle)
    for key, error_type in (
        ("ecc_corrected_volatile", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("ecc_uncorrected_volatile", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        count = _get(
            nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, nvml.NVML_VOLATILE_ECC
        )
        gpu[key] = _int(count)
    pending = _get_optional(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    gpu["retired_pages_pending"] = None if pending is None else bool(pending)
    rows = _get_optional(nvml, "nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        _corr, _unc, is_pending, failure = rows
        gpu["remapped_rows_pending"] = bool(is_pending)
        gpu["remapped_rows_failure"] = bool(failure)
    gpu["recovery_action"] = _recovery_action(nvml, handle)
    return gpu


def _thermal_slowdown(nvml: ModuleType, handle: Any) -> bool | None:
    mask = _get_optional(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:  # drivers before 535 only know the "throttle" name
        mask = _get_optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if mask is None:
        return None
    bits = getattr(nvml, "nvmlClocksEventReasonHwThermalSlowdown", _HW_THERMAL_BIT) | getattr(
        nvml, "nvmlClocksEventReasonSwThermalSlowdown", _SW_THERMAL_BIT
    )
    return bool(int(mask) & bits)


def _recovery_action(nvml: ModuleType, handle: Any) -> str | None:
    if hasattr(nvml, "nvmlDeviceGetGpuRecoveryAction"):
        code = _get(nvml, nvml.nvmlDeviceGetGpuRecoveryAction, handle)
    else:
        field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", _FI_GPU_RECOVERY_ACTION)
        values = _get_optional(nvml, "nvmlDeviceGetFieldValues", handle, [field_id])
        code = _field_value(nvml, values[0]) if values else None
    if code is None:
        return None
    code = int(code)
    return RECOVERY_ACTIONS.get(code, f"unknown_{code}")


def _field_value(nvml: ModuleType, value: Any) -> int | float | None:
    """Decode one ``c_nvmlFieldValue_t`` (a union tagged by ``valueType``)."""
    if int(getattr(value, "nvmlReturn", -1)) != int(getattr(nvml, "NVML_SUCCESS", 0)):
        return None
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    name = member.get(int(getattr(value, "valueType", 1)))
    if name is None:
        return None
    result = getattr(value.value, name, None)
    return result if isinstance(result, (int, float)) else None


def _get(nvml: ModuleType, fn: Callable[..., Any], *args: Any) -> Any:
    """Call an NVML getter; any ``NVMLError`` (NotSupported, NoPermission...) is ``None``."""
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        logger.debug("%s: %s", getattr(fn, "__name__", fn), exc)
        return None


def _get_optional(nvml: ModuleType, name: str, *args: Any) -> Any:
    """Like ``_get`` for getters that older ``pynvml`` releases do not define."""
    fn = getattr(nvml, name, None)
    return None if fn is None else _get(nvml, fn, *args)


def _is_unavailable(nvml: ModuleType, exc: BaseException) -> bool:
    classes = tuple(getattr(nvml, n) for n in _UNAVAILABLE_ERRORS if hasattr(nvml, n))
    codes = {getattr(nvml, n) for n in _UNAVAILABLE_CODES if hasattr(nvml, n)}
    return (bool(classes) and isinstance(exc, classes)) or getattr(exc, "value", None) in codes


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _milliwatts(value: Any) -> float | None:
    return None if value is None else round(int(value) / 1000.0, 2)


_XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError, if pynvml lacks the name


class XidWatcher:
    """Critical XID errors of this node's GPUs, through NVML events.

    NVML delivers an XID event only to an event set registered before it happens, so
    the watcher registers one set per GPU when it opens (the launcher's start) and
    :meth:`drain` returns what arrived since (or since the previous drain), by NVML
    index. NVML stays initialised while the watcher is open (``nvmlInit`` counts its
    callers: the collections' own init and shutdown do not end it). A node without NVML,
    or a GPU that has no events, gives nothing: :attr:`available` says whether any GPU
    is watched.
    """

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._sets: dict[int, Any] = {}
        self.error: str | None = None

    @property
    def available(self) -> bool:
        return bool(self._sets)

    def open(self) -> XidWatcher:
        try:
            import pynvml
        except ImportError as exc:
            self.error = f"pynvml: {exc}"
            return self
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:
            self.error = f"nvmlInit: {exc}"
            return self
        self._nvml = pynvml
        kind = getattr(pynvml, "nvmlEventTypeXidCriticalError", _XID_EVENT)
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            for i in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                event_set = pynvml.nvmlEventSetCreate()
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, kind, event_set)
                except pynvml.NVMLError as exc:  # no events on this GPU (NotSupported)
                    logger.debug("NVML XID events on GPU %d: %s", i, exc)
                    pynvml.nvmlEventSetFree(event_set)
                    continue
                self._sets[i] = event_set
        except (pynvml.NVMLError, AttributeError) as exc:
            self.error = f"XID events: {exc}"
        return self

    def drain(self) -> dict[int, list[int]]:
        """The XIDs that arrived since the last drain, by GPU index (no wait)."""
        nvml = self._nvml
        out: dict[int, list[int]] = {}
        if nvml is None:
            return out
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for index, event_set in self._sets.items():
            for _ in range(1000):  # bounded: a storm of events does not stall the check
                try:
                    data = wait(event_set, 0)
                except nvml.NVMLError:  # Timeout: nothing (more) pending
                    break
                out.setdefault(index, []).append(int(data.eventData))
        return out

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        for event_set in self._sets.values():
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as exc:
                logger.debug("nvmlEventSetFree: %s", exc)
        self._sets.clear()
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            logger.warning("nvmlShutdown failed: %s", exc)
