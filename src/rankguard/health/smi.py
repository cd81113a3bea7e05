"""GPU health through ``nvidia-smi --query-gpu`` (fallback when NVML cannot be used).

Some images ship the ``nvidia-smi`` binary without a usable ``pynvml``; the CSV query is
the lowest common denominator. Its text is hostile to naive parsing: a value may be
``[N/A]``, ``[Not Supported]``, ``Unknown Error`` or empty, numbers may carry units, and
the GPU name is free text. Every such value becomes ``None`` here, never an exception.

The call runs with a timeout (a wedged driver makes nvidia-smi hang for minutes); a
timeout or a non-zero exit is reported as status ``error`` with the message. A missing
binary, or nvidia-smi saying there is no driver or no device, is ``unavailable``.
"""

from __future__ import annotations

import csv
import logging
import re
import shutil
import subprocess
from typing import Any

from rankguard.health.schema import CollectionResult, NodeStatus, empty_gpu
from rankguard.schema.jsontypes import JsonObject

__all__ = ["QUERY_FIELDS", "SOURCE", "collect_smi", "parse_csv", "parse_value"]

logger = logging.getLogger(__name__)

SOURCE = "nvidia-smi"

#: nvidia-smi query field -> (our field, kind). Kinds: str, int, float, bool.
QUERY_FIELDS: dict[str, tuple[str, str]] = {
    "index": ("index", "int"),
    "uuid": ("uuid", "str"),
    "pci.bus_id": ("pci_bus_id", "str"),
    "name": ("name", "str"),
    "driver_version": ("driver_version", "str"),
    "temperature.gpu": ("temperature_c", "int"),
    "utilization.gpu": ("utilization_gpu_pct", "int"),
    "memory.used": ("memory_used_mib", "int"),
    "memory.total": ("memory_total_mib", "int"),
    "power.draw": ("power_draw_w", "float"),
    "power.limit": ("power_limit_w", "float"),
    "clocks_event_reasons.hw_thermal_slowdown": ("hw_thermal_slowdown", "bool"),
    "clocks_event_reasons.sw_thermal_slowdown": ("sw_thermal_slowdown", "bool"),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected_volatile", "int"),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected_volatile", "int"),
    "retired_pages.pending": ("retired_pages_pending", "bool"),
    "remapped_rows.pending": ("remapped_rows_pending", "bool"),
    "remapped_rows.failure": ("remapped_rows_failure", "bool"),
}
_NAME_COLUMN = list(QUERY_FIELDS).index("name")
_MISSING = {"", "n/a", "not supported", "unknown error", "unknown", "none", "-"}
_TRUE = {"active", "yes", "enabled", "true", "1"}
_FALSE = {"not active", "no", "disabled", "false", "0"}
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
# Messages of nvidia-smi meaning "no GPU here" rather than "a GPU is broken".
_NO_GPU_MESSAGES = ("couldn't communicate with the nvidia driver", "no devices were found")
_MESSAGE_LIMIT = 500


def parse_value(raw: str, kind: str) -> Any:
    """One CSV cell to a Python value; placeholders and garbage become ``None``."""
    text = raw.strip()
    lowered = text.lower()
    if lowered in _MISSING or (text.startswith("[") and text.endswith("]")):
        return None
    if kind == "str":
        return text
    if kind == "bool":
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        logger.debug("unexpected boolean from nvidia-smi: %r", raw)
        return None
    match = _NUMBER.match(text)  # strips units: "71.23 W", "45 %", "81559 MiB"
    if match is None:
        logger.debug("unexpected number from nvidia-smi: %r", raw)
        return None
    number = float(match.group(0))
    return int(number) if kind == "int" else number


def parse_csv(text: str) -> tuple[list[JsonObject], list[str]]:
    """Parse ``--format=csv,noheader,nounits`` output of ``QUERY_FIELDS``.

    Returns the GPUs and a list of problems (rows that could not be parsed). A row with
    too many columns is assumed to have commas in the GPU name, the only free-text field.
    """
    width = len(QUERY_FIELDS)
    gpus: list[JsonObject] = []
    problems: list[str] = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) > width:
            extra = len(row) - width
            name = ", ".join(row[_NAME_COLUMN : _NAME_COLUMN + extra + 1])
            row = [*row[:_NAME_COLUMN], name, *row[_NAME_COLUMN + extra + 1 :]]
        if len(row) != width:
            problems.append(f"expected {width} columns, got {len(row)}: {','.join(row)[:200]}")
            continue
        values = {
            ours: parse_value(cell, kind)
            for (ours, kind), cell in zip(QUERY_FIELDS.values(), row, strict=True)
        }
        gpu = empty_gpu()
        for key, value in values.items():
            if key in gpu:
                gpu[key] = value
        hw, sw = values["hw_thermal_slowdown"], values["sw_thermal_slowdown"]
        gpu["thermal_slowdown"] = None if hw is None and sw is None else bool(hw or sw)
        gpus.append(gpu)
    return gpus, problems


def collect_smi(*, command_timeout_s: float, executable: str = "nvidia-smi") -> CollectionResult:
    """Run one nvidia-smi query with a timeout and parse it."""
    path = shutil.which(executable)
    if path is None:
        return CollectionResult(SOURCE, NodeStatus.UNAVAILABLE, error="nvidia-smi not on PATH")
    fields = list(QUERY_FIELDS)
    result = _run(path, fields, command_timeout_s)
    if isinstance(result, CollectionResult):
        return result
    returncode, stdout, message = result
    if returncode != 0 and "not a valid field" in message.lower():
        # Drivers before 535 only know the "clocks_throttle_reasons" spelling.
        legacy = [f.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for f in fields]
        retry = _run(path, legacy, command_timeout_s)
        if isinstance(retry, CollectionResult):
            return retry
        returncode, stdout, message = retry
    if returncode != 0:
        lowered = message.lower()
        status = (
            NodeStatus.UNAVAILABLE
            if any(m in lowered for m in _NO_GPU_MESSAGES)
            else NodeStatus.ERROR
        )
        error = f"nvidia-smi exited with {returncode}: {message or '(no output)'}"
        return CollectionResult(SOURCE, status, error=error)
    gpus, problems = parse_csv(stdout)
    if problems:
        error = f"unparsable nvidia-smi output: {'; '.join(problems)}"[:_MESSAGE_LIMIT]
        return CollectionResult(SOURCE, NodeStatus.ERROR, gpus=gpus, error=error)
    if not gpus:
        return CollectionResult(SOURCE, NodeStatus.UNAVAILABLE, error="nvidia-smi lists no GPU")
    return CollectionResult(SOURCE, NodeStatus.OK, gpus=gpus)


def _run(path: str, fields: list[str], timeout_s: float) -> tuple[int, str, str] | CollectionResult:
    """Run the query; returns (returncode, stdout, short message) or a final result."""
    argv = [path, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        error = f"nvidia-smi timed out after {timeout_s:g} s"
        return CollectionResult(SOURCE, NodeStatus.ERROR, error=error)
    except FileNotFoundError as exc:
        return CollectionResult(SOURCE, NodeStatus.UNAVAILABLE, error=f"nvidia-smi: {exc}")
    except OSError as exc:
        return CollectionResult(SOURCE, NodeStatus.ERROR, error=f"nvidia-smi: {exc}")
    message = " ".join((proc.stderr.strip() or proc.stdout.strip()).split())[:_MESSAGE_LIMIT]
    return proc.returncode, proc.stdout, message
