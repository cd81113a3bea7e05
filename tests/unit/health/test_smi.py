"""nvidia-smi backend: CSV parsing, and the real subprocess path against tests/fakes/bin."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rankguard.health.schema import GPU_FIELDS, NodeStatus
from rankguard.health.smi import QUERY_FIELDS, collect_smi, parse_csv, parse_value

pytestmark = pytest.mark.timeout(20)


def _row(**cells: str) -> str:
    base = {
        "index": "0",
        "uuid": "GPU-abc",
        "pci.bus_id": "00000000:18:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "driver_version": "550.54.15",
        "temperature.gpu": "34",
        "utilization.gpu": "97",
        "memory.used": "40960",
        "memory.total": "81559",
        "power.draw": "512.34",
        "power.limit": "700.00",
        "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
        "clocks_event_reasons.sw_thermal_slowdown": "Not Active",
        "ecc.errors.corrected.volatile.total": "0",
        "ecc.errors.uncorrected.volatile.total": "0",
        "retired_pages.pending": "No",
        "remapped_rows.pending": "No",
        "remapped_rows.failure": "No",
    }
    base.update(cells)
    return ", ".join(base[f] for f in QUERY_FIELDS)


@pytest.mark.parametrize(
    ("raw", "kind", "expected"),
    [
        ("[N/A]", "int", None),
        ("N/A", "float", None),
        ("Not Supported", "int", None),
        ("[Not Supported]", "bool", None),
        ("Unknown Error", "int", None),
        ("[Unknown Error]", "str", None),
        ("", "int", None),
        ("  ", "str", None),
        ("[Insufficient Permissions]", "int", None),
        ("71.23 W", "float", 71.23),
        ("45 %", "int", 45),
        ("81559 MiB", "int", 81559),
        ("300.00", "float", 300.0),
        ("12.7", "int", 12),
        ("garbage", "int", None),
        ("Active", "bool", True),
        ("Not Active", "bool", False),
        ("Yes", "bool", True),
        ("No", "bool", False),
        ("maybe", "bool", None),
        (" GPU-abc ", "str", "GPU-abc"),
    ],
)
def test_parse_value(raw: str, kind: str, expected: Any) -> None:
    assert parse_value(raw, kind) == expected


def test_parse_csv_units_placeholders_and_flags() -> None:
    text = "\n".join(
        [
            _row(),
            _row(
                index="1",
                **{
                    "power.draw": "[N/A]",
                    "memory.used": "123 MiB",
                    "clocks_event_reasons.hw_thermal_slowdown": "[Not Supported]",
                    "clocks_event_reasons.sw_thermal_slowdown": "Active",
                    "ecc.errors.corrected.volatile.total": "Not Supported",
                    "remapped_rows.pending": "Yes",
                },
            ),
            "",
        ]
    )
    gpus, problems = parse_csv(text)
    assert problems == [] and len(gpus) == 2
    assert tuple(gpus[0]) == GPU_FIELDS
    assert gpus[0]["power_draw_w"] == 512.34 and gpus[0]["thermal_slowdown"] is False
    assert gpus[0]["recovery_action"] is None  # nvidia-smi has no such query field
    second = gpus[1]
    assert second["power_draw_w"] is None and second["memory_used_mib"] == 123
    assert second["thermal_slowdown"] is True
    assert second["ecc_corrected_volatile"] is None and second["remapped_rows_pending"] is True


def test_parse_csv_both_thermal_unknown_is_none() -> None:
    cells = {
        "clocks_event_reasons.hw_thermal_slowdown": "[N/A]",
        "clocks_event_reasons.sw_thermal_slowdown": "[N/A]",
    }
    gpus, _ = parse_csv(_row(**cells))
    assert gpus[0]["thermal_slowdown"] is None


def test_parse_csv_comma_in_name_and_short_row() -> None:
    gpus, problems = parse_csv(_row(name="Tesla V100, SXM2") + "\n0, GPU-x, 34\n")
    assert len(gpus) == 1 and gpus[0]["name"] == "Tesla V100, SXM2"
    assert gpus[0]["driver_version"] == "550.54.15"
    assert len(problems) == 1 and "expected" in problems[0]


def test_collect_default_fake_output(fake_smi: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "argv.jsonl"
    fake_smi.setenv("FAKE_SMI_ARGV_LOG", str(log))
    result = collect_smi(command_timeout_s=10)
    assert result.status is NodeStatus.OK and result.source == "nvidia-smi"
    assert [g["index"] for g in result.gpus] == [0, 1]
    assert result.gpus[1]["power_draw_w"] is None  # "[N/A]"
    assert result.gpus[1]["retired_pages_pending"] is None  # "[Not Supported]"
    argv = json.loads(log.read_text().splitlines()[0])
    assert argv == [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]


def test_collect_csv_from_file(fake_smi: pytest.MonkeyPatch, tmp_path: Path) -> None:
    csv_file = tmp_path / "smi.csv"
    csv_file.write_text(_row(**{"ecc.errors.uncorrected.volatile.total": "3"}) + "\n")
    fake_smi.setenv("FAKE_SMI_CSV_FILE", str(csv_file))
    result = collect_smi(command_timeout_s=10)
    assert result.status is NodeStatus.OK and result.gpus[0]["ecc_uncorrected_volatile"] == 3


def test_timeout_is_error_not_exception(fake_smi: pytest.MonkeyPatch) -> None:
    fake_smi.setenv("FAKE_SMI_SLEEP", "30")
    started = time.monotonic()
    result = collect_smi(command_timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert result.status is NodeStatus.ERROR and "timed out" in (result.error or "")


def test_nonzero_exit_is_error_with_message(fake_smi: pytest.MonkeyPatch) -> None:
    fake_smi.setenv("FAKE_SMI_EXIT", "15")
    fake_smi.setenv(
        "FAKE_SMI_STDERR", "Unable to determine the device handle for GPU0: GPU is lost"
    )
    result = collect_smi(command_timeout_s=10)
    assert result.status is NodeStatus.ERROR
    assert "15" in (result.error or "") and "GPU is lost" in (result.error or "")


def test_no_driver_message_is_unavailable(fake_smi: pytest.MonkeyPatch) -> None:
    fake_smi.setenv("FAKE_SMI_EXIT", "9")
    fake_smi.setenv(
        "FAKE_SMI_STDERR",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    )
    assert collect_smi(command_timeout_s=10).status is NodeStatus.UNAVAILABLE


def test_garbage_output_is_error(fake_smi: pytest.MonkeyPatch) -> None:
    fake_smi.setenv("FAKE_SMI_CSV", "this is not csv at all\n")
    result = collect_smi(command_timeout_s=10)
    assert result.status is NodeStatus.ERROR and "unparsable" in (result.error or "")


def test_old_driver_field_names_retried(fake_smi: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "argv.jsonl"
    fake_smi.setenv("FAKE_SMI_ARGV_LOG", str(log))
    fake_smi.setenv("FAKE_SMI_REJECT", "clocks_event_reasons")
    result = collect_smi(command_timeout_s=10)
    assert result.status is NodeStatus.OK and len(result.gpus) == 2
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2 and "clocks_throttle_reasons.hw_thermal_slowdown" in calls[1][0]


def test_not_on_path_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = collect_smi(command_timeout_s=1)
    assert result.status is NodeStatus.UNAVAILABLE and result.gpus == []
