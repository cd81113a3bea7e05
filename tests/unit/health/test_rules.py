"""Health rules: each unhealthy and warning condition, baselines and the node verdict."""

from __future__ import annotations

from typing import Any

import pytest

from rankguard.health.rules import (
    apply_rules,
    evaluate_gpu,
    gpu_key,
    node_status,
    update_baseline,
)
from rankguard.health.schema import GpuHealth, NodeStatus, empty_gpu


def _gpu(**fields: Any) -> dict[str, Any]:
    gpu = empty_gpu(0)
    gpu.update(
        uuid="GPU-aaa",
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=0,
        retired_pages_pending=False,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        thermal_slowdown=False,
        recovery_action="none",
    )
    gpu.update(fields)
    return gpu


def test_healthy_gpu_and_all_unknown_gpu_are_ok() -> None:
    assert evaluate_gpu(_gpu()) == (GpuHealth.OK, [])
    assert evaluate_gpu(empty_gpu(3), baseline_corrected=0) == (GpuHealth.OK, [])


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"ecc_uncorrected_volatile": 3}, "ecc_uncorrected_volatile=3"),
        ({"remapped_rows_failure": True}, "remapped_rows_failure"),
        ({"recovery_action": "gpu_reset"}, "recovery_action=gpu_reset"),
        ({"recovery_action": "node_reboot"}, "recovery_action=node_reboot"),
        ({"recovery_action": "drain_and_reset"}, "recovery_action=drain_and_reset"),
        ({"query_error": "GPU is lost"}, "gpu_query_failed"),
    ],
)
def test_unhealthy_rules(fields: dict[str, Any], problem: str) -> None:
    health, problems = evaluate_gpu(_gpu(**fields))
    assert health is GpuHealth.UNHEALTHY and problems == [problem]


@pytest.mark.parametrize(
    "flag", ["retired_pages_pending", "remapped_rows_pending", "thermal_slowdown"]
)
def test_warning_flags(flag: str) -> None:
    assert evaluate_gpu(_gpu(**{flag: True})) == (GpuHealth.WARNING, [flag])


def test_corrected_ecc_warns_only_on_increase_over_baseline() -> None:
    assert evaluate_gpu(_gpu(ecc_corrected_volatile=7)) == (GpuHealth.OK, [])  # no baseline
    assert evaluate_gpu(_gpu(ecc_corrected_volatile=7), 7) == (GpuHealth.OK, [])
    assert evaluate_gpu(_gpu(ecc_corrected_volatile=7), 9) == (GpuHealth.OK, [])
    assert evaluate_gpu(_gpu(ecc_corrected_volatile=9), 7) == (
        GpuHealth.WARNING,
        ["ecc_corrected_volatile_increase=2"],
    )
    assert evaluate_gpu(_gpu(ecc_corrected_volatile=None), 7) == (GpuHealth.OK, [])


def test_unhealthy_lists_warnings_too() -> None:
    health, problems = evaluate_gpu(_gpu(ecc_uncorrected_volatile=1, thermal_slowdown=True))
    assert health is GpuHealth.UNHEALTHY
    assert problems == ["ecc_uncorrected_volatile=1", "thermal_slowdown"]


def test_gpu_key_prefers_uuid() -> None:
    assert gpu_key(_gpu()) == "GPU-aaa"
    assert gpu_key(_gpu(uuid=None, index=2)) == "index:2"


def test_update_baseline_keeps_first_and_lowers_after_reset() -> None:
    baseline: dict[str, int] = {}
    update_baseline(baseline, [_gpu(ecc_corrected_volatile=5), _gpu(uuid="GPU-b")])
    update_baseline(baseline, [_gpu(ecc_corrected_volatile=8)])
    assert baseline == {"GPU-aaa": 5, "GPU-b": 0}
    update_baseline(baseline, [_gpu(ecc_corrected_volatile=1)])  # counters reset
    assert baseline["GPU-aaa"] == 1
    update_baseline(baseline, [_gpu(uuid="GPU-c", ecc_corrected_volatile=None)])
    assert "GPU-c" not in baseline


def test_apply_rules_uses_baseline_by_key_and_copies() -> None:
    gpus = [_gpu(ecc_corrected_volatile=4), _gpu(uuid="GPU-b", ecc_corrected_volatile=4)]
    out = apply_rules(gpus, {"GPU-aaa": 1, "GPU-b": 4})
    assert [g["health"] for g in out] == ["warning", "ok"]
    assert out[0]["problems"] == ["ecc_corrected_volatile_increase=3"]
    assert "health" not in gpus[0]


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([], NodeStatus.OK),
        (["ok", "ok"], NodeStatus.OK),
        (["ok", "warning"], NodeStatus.WARNING),
        (["unhealthy", "warning", "ok"], NodeStatus.UNHEALTHY),
    ],
)
def test_node_status_is_worst_gpu(verdicts: list[str], expected: NodeStatus) -> None:
    assert node_status(NodeStatus.OK, [{"health": v} for v in verdicts]) is expected


def test_node_status_keeps_unavailable_and_error() -> None:
    assert node_status(NodeStatus.UNAVAILABLE, []) is NodeStatus.UNAVAILABLE
    assert node_status(NodeStatus.ERROR, [{"health": "ok"}]) is NodeStatus.ERROR
