"""Fault-tolerance configuration: defaults, validation naming the field, and the keys of
Megatron-Bridge's FaultTolerancePlugin."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rankguard.config import ConfigError, RankguardConfig, dumps_config, load_config
from rankguard.ft.config import ACTIONS, FAULT_TYPES, FaultToleranceConfig

DEFAULT_ACTIONS = {
    "rank_process_heartbeat_timeout": "restart",
    "gpu_progress_timeout": "restart",
    "rank_section_timeout": "restart",
    "rank_process_exited": "restart",
    "gpu_hardware_health_failure": "report",
    "gpu_hardware_health_warning": "report",
    "straggler_detected": "report",
    "node_disk_full": "report",
    # the rerun state machine's verdicts: the ranks act themselves (exit 16/17, stop)
    "rerun_transient_fault": "report",
    "rerun_persistent_fault": "report",
    "rerun_validation_failed": "report",
    "rerun_reproducible_fault": "report",
    "job_preempted": "report",
    "inprocess_restart": "report",
    # the agent's own: torch elastic restarts a failed group within its budget
    "worker_failed": "restart",
    # bad-node exclusion: the excluded node's launcher acted already (it left the job)
    "node_excluded": "report",
    # the node's own checks: it acts through bad-node exclusion, if on
    "node_health_failure": "report",
    "rank_uninterruptible_sleep": "report",
}

FT_PLUGIN_YAML = """\
fault_tolerance:
  enable_ft_package: true
  calc_ft_timeouts: true
  num_in_job_restarts: 3
  num_job_retries_on_failure: 2
  initial_rank_heartbeat_timeout: 1800
  rank_heartbeat_timeout: 300
  simulate_fault: false
  simulated_fault_type: random
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rankguard.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# ---- defaults ------------------------------------------------------------------------


def test_defaults() -> None:
    ft = FaultToleranceConfig()
    assert ft.actions == DEFAULT_ACTIONS
    assert ft.enable_ft_package is False
    assert ft.num_in_job_restarts == 0
    assert ft.num_job_retries_on_failure == 0
    assert ft.safety_factor == 5.0
    assert ft.min_learned_timeout_s == 60.0
    assert ft.stack_dump == "auto"
    assert ft.rank_section_timeouts == {}
    assert ft.rank_out_of_section_timeout is None
    assert ft.calc_ft_timeouts is False
    assert ft.simulate_fault is False
    assert ft.simulated_fault_type == "random"
    assert ft.initial_rank_heartbeat_timeout is None
    assert ft.rank_heartbeat_timeout is None
    assert set(ACTIONS) == {"report", "restart", "abort"}
    assert set(FAULT_TYPES) == {"rank_hung", "rank_killed", "rank_stalled", "random"}


def test_defaults_through_the_top_level_config() -> None:
    cfg = load_config()
    assert cfg.fault_tolerance.actions == DEFAULT_ACTIONS
    assert cfg.fault_tolerance.num_in_job_restarts == 0
    # No FaultTolerancePlugin timeout set: the heartbeat timeouts keep their own defaults.
    assert cfg.heartbeat.initial_process_timeout_s == 30.0
    assert cfg.heartbeat.process_timeout_s == 30.0


def test_actions_are_read_only_and_a_change_is_a_new_config() -> None:
    a = FaultToleranceConfig()
    with pytest.raises(TypeError, match="read-only"):
        a.actions["gpu_progress_timeout"] = "abort"
    b = dataclasses.replace(a, actions={**a.actions, "gpu_progress_timeout": "abort"})
    assert b.actions["gpu_progress_timeout"] == "abort"
    assert a.actions["gpu_progress_timeout"] == "restart"
    assert FaultToleranceConfig().actions["gpu_progress_timeout"] == "restart"


# ---- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"actions": {"gpu_progress_timeout": "reboot"}}, "actions.gpu_progress_timeout"),
        ({"actions": {"worker_failed": "abort"}}, "actions.worker_failed"),
        ({"actions": {"node_excluded": "restart"}}, "actions.node_excluded"),
        ({"num_in_job_restarts": -1}, "num_in_job_restarts"),
        ({"num_job_retries_on_failure": -2}, "num_job_retries_on_failure"),
        ({"stack_dump": "gdb"}, "stack_dump"),
        ({"rank_section_timeouts": {"step": 0.0}}, "rank_section_timeouts.step"),
        ({"rank_section_timeouts": {"setup": -5.0}}, "rank_section_timeouts.setup"),
        ({"rank_out_of_section_timeout": 0.0}, "rank_out_of_section_timeout"),
        ({"simulated_fault_type": "rank_exploded"}, "simulated_fault_type"),
        ({"simulated_fault_base_delay": -1.0}, "simulated_fault_base_delay"),
        ({"safety_factor": 0.5}, "safety_factor"),
        ({"safety_factor": 0.0}, "safety_factor"),
        ({"min_learned_timeout_s": 0.0}, "min_learned_timeout_s"),
        ({"stack_dump_timeout_s": 0.0}, "stack_dump_timeout_s"),
        ({"termination_grace_s": -1.0}, "termination_grace_s"),
    ],
)
def test_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as info:
        FaultToleranceConfig(**kwargs)
    assert str(info.value).startswith(f"{field}:"), str(info.value)


def test_bad_action_value_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"actions\.rank_process_exited: .*'reboot'") as info:
        FaultToleranceConfig(actions={"rank_process_exited": "reboot"})
    for allowed in ACTIONS:
        assert allowed in str(info.value)


def test_safety_factor_below_one_is_rejected_but_one_is_fine() -> None:
    with pytest.raises(ValueError, match=r"safety_factor: must be >= 1"):
        FaultToleranceConfig(safety_factor=0.9)
    assert FaultToleranceConfig(safety_factor=1.0).safety_factor == 1.0


def test_bad_simulated_fault_type_lists_the_types() -> None:
    with pytest.raises(ValueError) as info:
        FaultToleranceConfig(simulated_fault_type="hang")
    for name in FAULT_TYPES:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("fault_tolerance.actions.gpu_progress_timeout=reboot", "actions.gpu_progress_timeout"),
        ("fault_tolerance.num_in_job_restarts=-1", "num_in_job_restarts"),
        ("fault_tolerance.stack_dump=gdb", "stack_dump"),
        ("fault_tolerance.rank_section_timeouts=step:0", "rank_section_timeouts.step"),
        ("fault_tolerance.simulated_fault_type=boom", "simulated_fault_type"),
        ("fault_tolerance.safety_factor=0.5", "safety_factor"),
    ],
)
def test_validation_through_load_config_names_the_dotted_key(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert f"fault_tolerance.{field}:" in str(info.value), str(info.value)


def test_wrongly_typed_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"fault_tolerance\.num_in_job_restarts: expected an"):
        load_config(overrides=["fault_tolerance.num_in_job_restarts=three"])


def test_unknown_key_under_fault_tolerance_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fault_tolerance\.restarts_please"):
        load_config(overrides=["fault_tolerance.restarts_please=3"])
    path = _write(tmp_path, "fault_tolerance:\n  enable_ft: true\n")
    with pytest.raises(ConfigError, match=r"fault_tolerance\.enable_ft\b") as info:
        load_config(path)
    assert "enable_ft_package" in str(info.value)  # the allowed keys are listed


def test_unknown_finding_type_in_actions_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"actions\.gpu_progres_timeout"):
        FaultToleranceConfig(actions={"gpu_progres_timeout": "abort"})


# ---- merging and parsing -------------------------------------------------------------


def test_user_actions_merge_over_defaults() -> None:
    ft = FaultToleranceConfig(actions={"gpu_progress_timeout": "abort"})
    assert ft.actions == {**DEFAULT_ACTIONS, "gpu_progress_timeout": "abort"}


def test_user_actions_merge_over_defaults_from_yaml(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        fault_tolerance:
          actions:
            rank_process_exited: report
            gpu_hardware_health_failure: abort
        """,
    )
    actions = load_config(path).fault_tolerance.actions
    assert actions == {
        **DEFAULT_ACTIONS,
        "rank_process_exited": "report",
        "gpu_hardware_health_failure": "abort",
    }
    # An override adds to the file's actions and the defaults.
    cfg = load_config(path, ["fault_tolerance.actions.gpu_progress_timeout=abort"])
    assert cfg.fault_tolerance.actions["gpu_progress_timeout"] == "abort"
    assert cfg.fault_tolerance.actions["rank_process_exited"] == "report"
    assert cfg.fault_tolerance.actions["rank_process_heartbeat_timeout"] == "restart"


def test_section_timeouts_from_nvrx_command_line_string() -> None:
    cfg = load_config(
        overrides=[
            "fault_tolerance.rank_section_timeouts=setup:600,step:180,checkpointing:420",
            "fault_tolerance.rank_out_of_section_timeout=300",
        ]
    )
    timeouts = cfg.fault_tolerance.rank_section_timeouts
    assert timeouts == {"setup": 600.0, "step": 180.0, "checkpointing": 420.0}
    assert all(isinstance(v, float) for v in timeouts.values())
    assert cfg.fault_tolerance.rank_out_of_section_timeout == 300.0


def test_section_timeouts_of_a_frozen_config_cannot_be_changed() -> None:
    cfg = load_config(overrides=["fault_tolerance.rank_section_timeouts=step:180"])
    timeouts = cfg.fault_tolerance.rank_section_timeouts
    with pytest.raises(TypeError, match="read-only"):
        timeouts["step"] = 1.0  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        timeouts.update(setup=5.0)
    assert timeouts == {"step": 180.0}
    # a change is a new configuration; the old one keeps its sections
    sections = {**timeouts, "setup": 60.0}
    changed = dataclasses.replace(cfg.fault_tolerance, rank_section_timeouts=sections)
    sections["eval"] = 1.0
    assert changed.rank_section_timeouts == {"step": 180.0, "setup": 60.0}
    assert json.loads(dumps_config(cfg))["fault_tolerance"]["rank_section_timeouts"] == timeouts


def test_section_timeouts_string_tolerates_spaces_and_decimals() -> None:
    cfg = load_config(overrides=["fault_tolerance.rank_section_timeouts=step:1.5 , eval:90"])
    assert cfg.fault_tolerance.rank_section_timeouts == {"step": 1.5, "eval": 90.0}


def test_section_timeouts_from_yaml_mapping_and_string(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        fault_tolerance:
          rank_section_timeouts:
            setup: 600
            step: 180
            checkpointing: 420.5
        """,
    )
    assert load_config(path).fault_tolerance.rank_section_timeouts == {
        "setup": 600.0,
        "step": 180.0,
        "checkpointing": 420.5,
    }
    path = _write(tmp_path, "fault_tolerance:\n  rank_section_timeouts: 'setup:60,step:18'\n")
    assert load_config(path).fault_tolerance.rank_section_timeouts == {
        "setup": 60.0,
        "step": 18.0,
    }


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("setup600", r"fault_tolerance\.rank_section_timeouts: expected NAME:VALUE"),
        (":600", r"fault_tolerance\.rank_section_timeouts: expected NAME:VALUE"),
        ("step:fast", r"fault_tolerance\.rank_section_timeouts\.step: expected a number"),
        ("step:-1", r"fault_tolerance\.rank_section_timeouts\.step: must be > 0"),
    ],
)
def test_malformed_section_timeouts_name_the_key(value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(overrides=[f"fault_tolerance.rank_section_timeouts={value}"])


# ---- FaultTolerancePlugin names of the heartbeat timeouts -----------------------------


def test_ft_plugin_heartbeat_names_set_the_heartbeat_timeouts() -> None:
    cfg = load_config(
        overrides=[
            "fault_tolerance.initial_rank_heartbeat_timeout=1800",
            "fault_tolerance.rank_heartbeat_timeout=300",
        ]
    )
    assert cfg.heartbeat.initial_process_timeout_s == 1800.0
    assert cfg.heartbeat.process_timeout_s == 300.0


def test_ft_plugin_heartbeat_names_win_over_heartbeat_keys() -> None:
    cfg = load_config(
        overrides=["heartbeat.process_timeout_s=40", "fault_tolerance.rank_heartbeat_timeout=90"]
    )
    assert cfg.heartbeat.process_timeout_s == 90.0
    assert cfg.heartbeat.initial_process_timeout_s == 30.0  # the other one untouched


def test_ft_plugin_heartbeat_names_are_validated() -> None:
    # publish_interval_s defaults to 5: a 5 s process timeout is not > 5.
    with pytest.raises(ConfigError, match=r"heartbeat\.process_timeout_s: must be > publish"):
        load_config(overrides=["fault_tolerance.rank_heartbeat_timeout=5"])
    with pytest.raises(ConfigError, match=r"heartbeat\.initial_process_timeout_s: must be >"):
        load_config(overrides=["fault_tolerance.initial_rank_heartbeat_timeout=2"])
    # Validated against the configured publish interval, not the default one.
    cfg = load_config(
        overrides=["heartbeat.publish_interval_s=1", "fault_tolerance.rank_heartbeat_timeout=2"]
    )
    assert cfg.heartbeat.process_timeout_s == 2.0


def test_ft_plugin_heartbeat_names_directly_on_rankguard_config() -> None:
    cfg = RankguardConfig(
        fault_tolerance=FaultToleranceConfig(
            initial_rank_heartbeat_timeout=120.0, rank_heartbeat_timeout=60.0
        )
    )
    assert cfg.heartbeat.initial_process_timeout_s == 120.0
    assert cfg.heartbeat.process_timeout_s == 60.0
    with pytest.raises(ConfigError, match=r"heartbeat\.process_timeout_s"):
        RankguardConfig(fault_tolerance=FaultToleranceConfig(rank_heartbeat_timeout=1.0))


# ---- Megatron-Bridge's FaultTolerancePlugin options -----------------------------------


def test_ft_plugin_options_load(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, FT_PLUGIN_YAML))
    ft = cfg.fault_tolerance
    assert ft.enable_ft_package is True
    assert ft.calc_ft_timeouts is True
    assert ft.num_in_job_restarts == 3
    assert ft.num_job_retries_on_failure == 2
    assert ft.initial_rank_heartbeat_timeout == 1800.0
    assert ft.rank_heartbeat_timeout == 300.0
    assert ft.simulate_fault is False
    assert ft.simulated_fault_type == "random"
    assert cfg.heartbeat.initial_process_timeout_s == 1800.0
    assert cfg.heartbeat.process_timeout_s == 300.0
    assert ft.actions == DEFAULT_ACTIONS


def test_ft_plugin_options_in_the_flagscale_layout(tmp_path: Path) -> None:
    body = textwrap.indent(FT_PLUGIN_YAML, "    ")
    cfg = load_config(_write(tmp_path, "experiment:\n  runner:\n" + body))
    assert cfg.fault_tolerance.num_in_job_restarts == 3
    assert cfg.heartbeat.process_timeout_s == 300.0
