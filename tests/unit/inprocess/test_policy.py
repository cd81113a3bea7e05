"""Pure decisions of the in-process restart: budget, culprit, lost ranks, environment,
timeouts, config."""

from __future__ import annotations

import pytest

from rankguard.config import ConfigError, load_config
from rankguard.inprocess import InProcessRestartConfig
from rankguard.inprocess.policy import (
    NCCL_ENV,
    FaultReport,
    RestartBudget,
    apply_environment,
    choose_culprit,
    culprit_cause,
    lost_ranks,
    timeout_problems,
)


def test_budget_per_window_then_refused_then_allowed_again() -> None:
    budget = RestartBudget(per_window=2, window=10.0)
    assert budget.spend(0.0) is None
    assert budget.spend(1.0) is None
    refused = budget.spend(2.0)
    assert refused is not None and "max_restarts_per_window=2" in refused
    assert budget.used == 2  # a refusal spends nothing
    assert budget.spend(10.5) is None  # the first one left the window
    assert budget.spend(10.6) is not None


def test_budget_total_cap() -> None:
    budget = RestartBudget(per_window=100, window=1.0, total=2)
    assert budget.spend(0.0) is None and budget.spend(5.0) is None
    refused = budget.spend(10.0)
    assert refused is not None and "max_iterations=2" in refused


def test_zero_budget_refuses_the_first_restart() -> None:
    assert RestartBudget(per_window=0, window=1.0).spend(0.0) is not None


def _r(rank: int, cause: str, in_collective: bool = False, stuck: float = 0.0) -> FaultReport:
    return FaultReport(rank, cause, f"{cause} on {rank}", "h", in_collective, stuck)


def test_culprit_exception_before_hang_before_echoes() -> None:
    reports = [_r(0, "interrupted"), _r(3, "collective_error"), _r(2, "exception")]
    assert choose_culprit(reports) == reports[2]
    hang = [_r(0, "soft_timeout", True, 60.0), _r(1, "soft_timeout", stuck=60.0)]
    assert choose_culprit(hang, 30.0) == hang[1]  # outside the collective: it holds them up
    # the waiting rank timed out first and interrupted the stuck one: still the stuck one
    hang = [_r(0, "soft_timeout", True, 60.0), _r(1, "interrupted", stuck=59.9)]
    assert choose_culprit(hang, 30.0) == hang[1]
    assert culprit_cause(hang[1], 30.0) == "soft_timeout"
    busy = [_r(0, "soft_timeout", True, 60.0), _r(1, "interrupted", stuck=0.01)]
    assert choose_culprit(busy, 30.0) == busy[0]  # rank 1 was running: not stuck
    assert choose_culprit([_r(4, "interrupted"), _r(1, "interrupted")]).rank == 1  # type: ignore[union-attr]
    assert choose_culprit([]) is None


def test_culprit_is_the_same_whatever_the_order() -> None:
    reports = [_r(1, "soft_timeout"), _r(0, "soft_timeout"), _r(2, "interrupted")]
    assert choose_culprit(reports) == choose_culprit(list(reversed(reports)))


def test_fault_report_round_trip_and_validation() -> None:
    report = _r(1, "soft_timeout", True)
    assert FaultReport.from_json(report.to_json()) == report
    with pytest.raises(ValueError, match="cause"):
        FaultReport.from_json('{"rank": 1, "cause": "bogus"}')
    with pytest.raises(ValueError, match="rank"):
        FaultReport.from_json('{"rank": "1", "cause": "exception"}')


def test_lost_ranks_by_granularity() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert lost_ranks([2], "rank", hosts) == [2]
    assert lost_ranks([2], "node", hosts) == [2, 3]
    assert lost_ranks([5], "node", hosts) == [5]  # never seen: no host to take along


def test_environment_set_only_where_unset() -> None:
    env = {"NCCL_NVLS_ENABLE": "1"}
    lines, problems = apply_environment(env)
    assert env["TORCH_CPP_LOG_LEVEL"] == "error"
    assert env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"
    assert env["NCCL_NVLS_ENABLE"] == "1"  # the user's value is kept, and said
    assert any("NCCL_NVLS_ENABLE=1 kept" in line for line in lines)
    assert set(NCCL_ENV) <= set(env) and problems == []
    again, problems = apply_environment(env, torch_imported=True)  # as the launcher left it
    assert "TORCH_CPP_LOG_LEVEL=error" in again and problems == []


def test_the_log_level_set_after_torchs_import_is_said_to_have_no_effect() -> None:
    env: dict[str, str] = {}
    lines, problems = apply_environment(env, torch_imported=True)
    assert env["TORCH_CPP_LOG_LEVEL"] == "error"  # for the processes it starts
    assert [p.split(" ", 1)[0] for p in problems] == ["TORCH_CPP_LOG_LEVEL=error"]
    assert "too late" in problems[0] and "launch environment" in problems[0]
    assert "TORCH_NCCL_RETHROW_CUDA_ERRORS=0 set" in lines  # read when a group is made


def test_nccl_timeouts_must_exceed_hard_timeout() -> None:
    fine, problems = timeout_problems(backend="nccl", pg_timeout=600, hard_timeout=90, environ={})
    assert not problems and len(fine) == 2
    _, problems = timeout_problems(
        backend="nccl",
        pg_timeout=60,
        hard_timeout=90,
        environ={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "30", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
    )
    assert len(problems) == 3
    assert "kills the rank first" in problems[0]
    fine, problems = timeout_problems(backend="gloo", pg_timeout=60, hard_timeout=90, environ={})
    assert not problems and "gloo" in fine[0]


def test_config_defaults_are_megatron_bridges() -> None:
    cfg = InProcessRestartConfig()
    assert (cfg.enabled, cfg.granularity, cfg.soft_timeout, cfg.hard_timeout) == (
        False,
        "node",
        60.0,
        90.0,
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"granularity": "host"}, "granularity"),
        ({"soft_timeout": 90.0, "hard_timeout": 90.0}, "hard_timeout"),
        ({"soft_timeout": float("nan")}, "soft_timeout"),
        ({"monitor_thread_interval": 60.0}, "monitor_thread_interval"),
        ({"heartbeat_interval": 20.0, "heartbeat_timeout": 10.0}, "heartbeat_interval"),
        ({"max_restarts_per_window": -1}, "max_restarts_per_window"),
        ({"backend": "mpi"}, "backend"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        InProcessRestartConfig(**kwargs)  # type: ignore[arg-type]


def test_config_keys_under_the_root_config() -> None:
    cfg = load_config(
        None, ["inprocess_restart.enabled=true", "inprocess_restart.granularity=rank"]
    )
    assert cfg.inprocess_restart.enabled and cfg.inprocess_restart.granularity == "rank"
    with pytest.raises(ConfigError, match=r"inprocess_restart\.bogus"):
        load_config(None, ["inprocess_restart.bogus=1"])
    with pytest.raises(ConfigError, match=r"inprocess_restart\.granularity"):
        load_config(None, ["inprocess_restart.granularity=host"])


def test_warning_when_the_monitor_would_act_before_the_soft_timeout() -> None:
    cfg = load_config(
        None,
        [
            "heartbeat.enabled=true",
            "heartbeat.progress_timeout_s=30",
            "inprocess_restart.enabled=true",
        ],
    )
    assert any(
        "progress_timeout_s=30 <= inprocess_restart.soft_timeout=60" in w for w in cfg.warnings()
    )
    cfg = load_config(None, ["heartbeat.enabled=true", "inprocess_restart.enabled=true"])
    assert not any("soft_timeout" in w for w in cfg.warnings())
