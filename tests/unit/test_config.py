"""Strict configuration: FlagScale's heartbeat YAML, the defaults, errors that name the key."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from rankguard.config import (
    ConfigError,
    RankguardConfig,
    apply_override,
    build,
    config_to_dict,
    dumps_config,
    load_config,
    loads_config,
)
from rankguard.monitor.config import HardwareHealthConfig, HeartbeatConfig

FLAGSCALE_YAML = """\
experiment:
  runner:
    no_shared_fs: false
    heartbeat:
      enabled: true
      publish_interval_s: 5
      process_timeout_s: 30
      progress_timeout_s: 300
      checkpoint_timeout_s: 1800
      hardware_health:
        enabled: true
        interval_s: 60
"""

# FlagScale's heartbeat usage section, verbatim: the block above must stay a copy of it.
FLAGSCALE_HEARTBEAT_DOC = """\
Enable heartbeat under experiment.runner in the training configuration:

experiment:
  runner:
    no_shared_fs: false
    heartbeat:
      enabled: true
      publish_interval_s: 5
      process_timeout_s: 30
      progress_timeout_s: 300
      checkpoint_timeout_s: 1800
      hardware_health:
        enabled: true
        interval_s: 60

After enabling the heartbeat, start the FlagScale training task with the existing launch \
command. No additional build step or separate monitoring command is required.
"""

HEARTBEAT_KEYS = (
    "checkpoint_timeout_s, enabled, eval_timeout_s, hardware_health, incremental_rules, "
    "initial_process_timeout_s, initial_progress_timeout_s, max_file_mb, "
    "mirror_relayed_max_ranks, phase_detection, phase_patterns, process_timeout_s, "
    "progress_timeout_s, publish_interval_s, scan_interval_s, status_detail_interval_s, "
    "status_rank_rows, status_worst_ranks"
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_flagscale_heartbeat_block_loads(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, FLAGSCALE_YAML))
    assert cfg.no_shared_fs is False
    hb = cfg.heartbeat
    assert hb.enabled is True
    assert hb.publish_interval_s == 5.0 and isinstance(hb.publish_interval_s, float)
    assert hb.process_timeout_s == 30.0
    assert hb.progress_timeout_s == 300.0
    assert hb.checkpoint_timeout_s == 1800.0
    assert hb.hardware_health.enabled is True
    assert hb.hardware_health.interval_s == 60.0
    # not in FlagScale's block: defaults
    assert hb.initial_process_timeout_s == 30.0
    assert hb.initial_progress_timeout_s == 600.0
    assert cfg.log_dir == "rankguard_logs"


def test_flagscale_heartbeat_block_is_the_documented_one() -> None:
    """FLAGSCALE_YAML is FlagScale's documented block, line for line."""
    block = "\n".join(line for line in FLAGSCALE_YAML.splitlines())
    assert block in FLAGSCALE_HEARTBEAT_DOC


def test_defaults_equal_the_documented_values() -> None:
    cfg = load_config()
    assert cfg == RankguardConfig()
    hb = cfg.heartbeat
    assert hb.enabled is False
    assert hb.publish_interval_s == 5
    assert hb.initial_process_timeout_s == 30
    assert hb.process_timeout_s == 30
    assert hb.initial_progress_timeout_s == 600
    assert hb.progress_timeout_s == 300
    assert hb.checkpoint_timeout_s == 1800
    assert hb.scan_interval_s == 1
    hh = hb.hardware_health
    assert hh.enabled is False
    assert hh.interval_s == 60
    assert hh.command_timeout_s == 10
    assert hh.stale_after_s == 180


def test_stale_after_defaults_to_three_intervals() -> None:
    assert HardwareHealthConfig(interval_s=20, command_timeout_s=5).stale_after_s == 60
    cfg = load_config(overrides=["heartbeat.hardware_health.interval_s=30"])
    assert cfg.heartbeat.hardware_health.stale_after_s == 90


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "")) == RankguardConfig()


def test_flat_layout_loads(tmp_path: Path) -> None:
    cfg = load_config(
        _write(
            tmp_path,
            """\
            log_dir: /tmp/x
            heartbeat:
              enabled: true
              scan_interval_s: 0.5
            """,
        )
    )
    assert cfg.log_dir == "/tmp/x"
    assert cfg.heartbeat.enabled is True and cfg.heartbeat.scan_interval_s == 0.5


# ---- unknown keys --------------------------------------------------------------------


def test_unknown_key_names_dotted_key_and_allowed(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        heartbeat:
          enabled: true
          publish_intervall_s: 5
        """,
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "heartbeat.publish_intervall_s" in msg
    assert f"allowed under heartbeat: {HEARTBEAT_KEYS}" in msg


def test_unknown_nested_key_in_flagscale_layout(tmp_path: Path) -> None:
    text = FLAGSCALE_YAML.replace(
        "        interval_s: 60", "        interval_s: 60\n        foo: 1"
    )
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    msg = str(err.value)
    assert "heartbeat.hardware_health.foo" in msg
    assert "command_timeout_s, enabled, interval_s, stale_after_s" in msg


def test_unknown_top_level_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) bogus; allowed under <root>"):
        load_config(_write(tmp_path, "bogus: 1\n"))


def test_flagscale_sections_beside_the_runner_are_left_alone(tmp_path: Path) -> None:
    text = FLAGSCALE_YAML.replace("experiment:\n", "experiment:\n  trainer: {}\n")
    cfg = load_config(_write(tmp_path, text))
    assert cfg.heartbeat.enabled is True


def test_misspelt_rankguard_key_in_the_runner_is_an_error(tmp_path: Path) -> None:
    text = FLAGSCALE_YAML.replace("    heartbeat:\n", "    heartbeet:\n", 1)
    with pytest.raises(ConfigError, match=r"experiment\.runner\.heartbeet.*heartbeat"):
        load_config(_write(tmp_path, text))


def test_experiment_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="experiment"):
        load_config(_write(tmp_path, "experiment: 3\n"))


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))


def test_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "heartbeat: [\n"))


# ---- types ---------------------------------------------------------------------------


def test_string_for_float_names_field(tmp_path: Path) -> None:
    path = _write(tmp_path, 'heartbeat:\n  publish_interval_s: "5"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == "heartbeat.publish_interval_s: expected a number, got '5'"


def test_quoted_yes_for_bool_names_field(tmp_path: Path) -> None:
    path = _write(tmp_path, 'heartbeat:\n  enabled: "yes"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == "heartbeat.enabled: expected true or false, got 'yes'"


def test_bool_is_not_a_number() -> None:
    with pytest.raises(ConfigError, match=r"heartbeat\.process_timeout_s: expected a number"):
        load_config(overrides=["heartbeat.process_timeout_s=true"])


def test_section_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="heartbeat: expected a mapping"):
        load_config(_write(tmp_path, "heartbeat: 5\n"))


def test_optional_float_accepts_null_and_number(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            "heartbeat.hardware_health.interval_s=10",
            "heartbeat.hardware_health.command_timeout_s=2",
            "heartbeat.hardware_health.stale_after_s=null",
        ]
    )
    assert cfg.heartbeat.hardware_health.stale_after_s == 30
    cfg = load_config(overrides=["heartbeat.hardware_health.stale_after_s=500"])
    assert cfg.heartbeat.hardware_health.stale_after_s == 500.0
    with pytest.raises(ConfigError, match=r"heartbeat\.hardware_health\.stale_after_s"):
        load_config(overrides=["heartbeat.hardware_health.stale_after_s=soon"])


# ---- validation rules ------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "initial_process_timeout_s",
        "process_timeout_s",
        "initial_progress_timeout_s",
        "progress_timeout_s",
        "checkpoint_timeout_s",
    ],
)
def test_timeout_not_above_publish_interval(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"heartbeat.{name}=5"])  # == publish_interval_s
    assert str(err.value).startswith(f"heartbeat.{name}: must be > publish_interval_s (5.0)")


def test_timeout_just_above_publish_interval_is_fine() -> None:
    cfg = load_config(
        overrides=["heartbeat.publish_interval_s=2", "heartbeat.process_timeout_s=2.5"]
    )
    assert cfg.heartbeat.process_timeout_s == 2.5


def test_checkpoint_timeout_below_progress_timeout() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["heartbeat.checkpoint_timeout_s=299"])
    assert str(err.value).startswith("heartbeat.checkpoint_timeout_s: must be >= progress")
    # equal is allowed
    cfg = load_config(overrides=["heartbeat.checkpoint_timeout_s=300"])
    assert cfg.heartbeat.checkpoint_timeout_s == 300


@pytest.mark.parametrize("value", ["60", "61"])
def test_command_timeout_not_below_interval(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"heartbeat.hardware_health.command_timeout_s={value}"])
    assert str(err.value).startswith(
        "heartbeat.hardware_health.command_timeout_s: must be > 0 and < interval_s (60.0)"
    )


@pytest.mark.parametrize("value", ["60", "30"])
def test_stale_after_not_above_interval(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"heartbeat.hardware_health.stale_after_s={value}"])
    assert str(err.value).startswith(
        "heartbeat.hardware_health.stale_after_s: must be > interval_s (60.0)"
    )


@pytest.mark.parametrize(
    ("override", "field_name"),
    [
        ("heartbeat.publish_interval_s=0", "heartbeat.publish_interval_s"),
        ("heartbeat.scan_interval_s=-1", "heartbeat.scan_interval_s"),
        ("heartbeat.hardware_health.interval_s=0", "heartbeat.hardware_health.interval_s"),
    ],
)
def test_non_positive_intervals(override: str, field_name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(field_name)}: must be > 0"):
        load_config(overrides=[override])


def test_empty_log_dir() -> None:
    with pytest.raises(ConfigError, match="log_dir"):
        load_config(overrides=["log_dir="])


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ---- overrides -----------------------------------------------------------------------


def test_overrides_short_and_flagscale_forms(tmp_path: Path) -> None:
    cfg = load_config(
        _write(tmp_path, FLAGSCALE_YAML),
        overrides=[
            "heartbeat.publish_interval_s=2",
            "experiment.runner.heartbeat.process_timeout_s=12.5",
            "experiment.runner.heartbeat.hardware_health.enabled=false",
            "no_shared_fs=true",
            "log_dir=/var/log/rg",
        ],
    )
    assert cfg.heartbeat.publish_interval_s == 2.0
    assert cfg.heartbeat.process_timeout_s == 12.5
    assert cfg.heartbeat.progress_timeout_s == 300.0  # from the file
    assert cfg.heartbeat.hardware_health.enabled is False
    assert cfg.no_shared_fs is True
    assert cfg.log_dir == "/var/log/rg"


def test_override_without_file_and_later_wins() -> None:
    cfg = load_config(
        overrides=["heartbeat.enabled=true", "heartbeat.enabled=false", "heartbeat.enabled=yes"]
    )
    assert cfg.heartbeat.enabled is True


def test_override_unknown_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"heartbeat\.nope"):
        load_config(overrides=["experiment.runner.heartbeat.nope=1"])


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("heartbeat.enabled", "expected key=value"),
        ("=5", "malformed key"),
        ("heartbeat..enabled=true", "malformed key"),
        (".enabled=true", "malformed key"),
        ("heartbeat.enabled.x=1", "enabled is not a section"),
        ("heartbeat.enabled=[1, 2", "cannot parse value"),
    ],
)
def test_malformed_override(override: str, match: str) -> None:
    doc: dict[str, object] = {"heartbeat": {"enabled": True}}
    with pytest.raises(ConfigError, match=match):
        apply_override(doc, override)


def test_apply_override_parses_yaml_scalars() -> None:
    doc: dict[str, object] = {}
    apply_override(doc, "a.b=5")
    apply_override(doc, "a.c=0.5")
    apply_override(doc, "a.d=null")
    apply_override(doc, "a.e=text with = sign")
    apply_override(doc, "experiment.runner.f=true")
    assert doc == {"a": {"b": 5, "c": 0.5, "d": None, "e": "text with = sign"}, "f": True}


def test_missing_file_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(missing)
    assert str(err.value) == f"config file {missing}: No such file or directory"


# ---- serialisation -------------------------------------------------------------------


def test_dumps_loads_round_trip(tmp_path: Path) -> None:
    cfg = load_config(
        _write(tmp_path, FLAGSCALE_YAML),
        overrides=["heartbeat.hardware_health.stale_after_s=200", "log_dir=/x"],
    )
    text = dumps_config(cfg)
    again = loads_config(text)
    assert again == cfg
    assert dumps_config(again) == text
    assert loads_config(dumps_config(RankguardConfig())) == RankguardConfig()


def test_config_to_dict_is_plain() -> None:
    d = config_to_dict(RankguardConfig())
    assert d["heartbeat"]["hardware_health"]["stale_after_s"] == 180.0
    assert set(d) == {
        "log_dir",
        "run_dir_mode",
        "no_shared_fs",
        "enable_gpu_health_check",
        "enable_monitoring",
        "exit_codes",
        "envs",
        "heartbeat",
        "perf",
        "fault_tolerance",
        "straggler",
        "checkpoint",
        "rerun_state_machine",
        "preemption",
        "inprocess_restart",
        "elastic",
        "node_health",
    }
    assert d["perf"]["log_interval"] == 10 and d["perf"]["model"] is None


def test_loads_config_is_strict() -> None:
    with pytest.raises(ConfigError, match=r"heartbeat\.extra"):
        loads_config('{"heartbeat": {"extra": 1}}')


def test_build_component_directly() -> None:
    hb = build(HeartbeatConfig, {"publish_interval_s": 1, "process_timeout_s": 3})
    assert hb.process_timeout_s == 3.0
    with pytest.raises(ConfigError, match=r"^process_timeout_s: must be >"):
        build(HeartbeatConfig, {"process_timeout_s": 1})


def test_a_quiet_config_has_no_warnings() -> None:
    assert load_config(None, ["heartbeat.enabled=true"]).warnings() == []


def test_heartbeat_off_is_a_warning() -> None:
    assert RankguardConfig().warnings() == [
        "heartbeat monitoring is OFF (heartbeat.enabled=false): no liveness, progress "
        "or hang detection for this run"
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "heartbeat.hardware_health.enabled=true",
            "heartbeat.hardware_health.enabled=true has NO effect while "
            "heartbeat.enabled=false: set heartbeat.enabled=true",
        ),
        (
            "fault_tolerance.enable_ft_package=true",
            "fault_tolerance.enable_ft_package=true but heartbeat.enabled=false: hangs are "
            "NOT detected and will NOT be restarted; only crashes restart. Set "
            "heartbeat.enabled=true",
        ),
        (
            "perf.prometheus.enabled=true",
            "perf.prometheus.enabled=true has NO effect while heartbeat.enabled=false "
            "(the exporter serves the job monitor's state)",
        ),
    ],
)
def test_a_switch_that_needs_the_heartbeat_monitor_warns_without_it(
    override: str, message: str
) -> None:
    off = load_config(None, [override]).warnings()
    assert off[0] == message and off[1].startswith("heartbeat monitoring is OFF")
    assert len(off) == 2
    assert load_config(None, [override, "heartbeat.enabled=true"]).warnings() == []


def test_warnings_come_in_a_fixed_order() -> None:
    cfg = load_config(
        None,
        [
            "perf.prometheus.enabled=true",
            "fault_tolerance.enable_ft_package=true",
            "heartbeat.hardware_health.enabled=true",
        ],
    )
    starts = (
        "heartbeat.hardware_health.enabled=true",
        "fault_tolerance.enable_ft_package=true",
        "perf.prometheus.enabled=true",
        "heartbeat monitoring is OFF",
    )
    warnings = cfg.warnings()
    assert len(warnings) == len(starts)
    assert all(w.startswith(s) for w, s in zip(warnings, starts, strict=True))


# --------------------------------------------------------------------------- numbers, nesting


def _numeric_keys(cls: type, prefix: str = "") -> list[str]:
    """Every int/float setting of the config tree, by full dotted key (the optional
    model shape, whose fields are all required together, is checked in perf's tests)."""
    import dataclasses
    import typing

    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if dataclasses.is_dataclass(args[0]) and prefix + f.name != "perf.model":
            keys += _numeric_keys(args[0], f"{prefix}{f.name}.")
        elif args[0] in (int, float):
            keys.append(prefix + f.name)
    return keys


NUMERIC_KEYS = _numeric_keys(RankguardConfig)


def test_the_walk_finds_the_numeric_settings() -> None:
    assert "heartbeat.process_timeout_s" in NUMERIC_KEYS
    assert "heartbeat.hardware_health.stale_after_s" in NUMERIC_KEYS
    assert "fault_tolerance.rank_heartbeat_timeout" in NUMERIC_KEYS
    assert "straggler.profiling_interval" in NUMERIC_KEYS
    assert "perf.prometheus.port" in NUMERIC_KEYS
    assert len(NUMERIC_KEYS) > 30


@pytest.mark.parametrize("key", NUMERIC_KEYS)
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "-1", "1.0e999"])
def test_every_numeric_setting_rejects_non_finite_and_negative(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{key}={value}"])
    assert str(err.value).startswith(f"{key}: ")


@pytest.mark.parametrize("value", [".nan", ".inf", ".NaN", "-.Inf"])
def test_non_finite_timeout_in_yaml_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    path = _write(tmp_path, f"heartbeat:\n  process_timeout_s: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(
        "heartbeat.process_timeout_s: must be a finite number > 0, got "
    )


def test_nan_message_names_key_and_bound() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["heartbeat.process_timeout_s=.nan"])
    assert str(err.value) == "heartbeat.process_timeout_s: must be a finite number > 0, got nan"


def test_integer_too_large_for_a_float_is_a_config_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "heartbeat:\n  process_timeout_s: 1" + "0" * 400 + "\n")
    with pytest.raises(ConfigError, match=r"^heartbeat\.process_timeout_s: must be a finite"):
        load_config(path)


def test_non_finite_values_through_the_json_handoff_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^heartbeat\.scan_interval_s: must be a finite"):
        loads_config('{"heartbeat": {"scan_interval_s": NaN}}')


def test_component_built_directly_rejects_nan() -> None:
    with pytest.raises(ValueError, match=r"^process_timeout_s: must be a finite number > 0"):
        HeartbeatConfig(process_timeout_s=float("nan"))
    with pytest.raises(ValueError, match=r"^interval_s: must be a finite number > 0"):
        HardwareHealthConfig(interval_s=float("inf"))


@pytest.mark.parametrize(
    "text", ["[" * 200 + "]" * 200, "a:\n" + "".join(f"{'  ' * i}b:\n" for i in range(1, 60))]
)
def test_deep_yaml_file_is_refused_clearly(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"nested deeper than 32 levels \(line"):
        load_config(path)


def test_very_deep_yaml_is_refused_without_recursion_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "heartbeat: " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested deeper than 32 levels"):
        load_config(path)


def test_deep_override_value_and_key_are_refused_clearly() -> None:
    with pytest.raises(ConfigError, match=r"^override .*: value nested deeper than"):
        load_config(overrides=["heartbeat.enabled=" + "[" * 5000 + "]" * 5000])
    with pytest.raises(ConfigError, match=r"key nested deeper than 32 levels"):
        load_config(overrides=[".".join(["a"] * 40) + "=1"])


def test_moderate_nesting_still_reports_the_real_problem(tmp_path: Path) -> None:
    path = _write(tmp_path, "heartbeat:\n  enabled: " + "[" * 10 + "]" * 10 + "\n")
    with pytest.raises(ConfigError, match=r"^heartbeat\.enabled: expected true or false"):
        load_config(path)


def test_error_messages_stay_short_for_aliased_documents(tmp_path: Path) -> None:
    # Each level repeats the previous one four times: its full repr would be millions of
    # characters long.
    items = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    items += [f"&a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    path = _write(tmp_path, f"heartbeat:\n  enabled: [{', '.join(items)}]\n")
    with pytest.raises(ConfigError, match=r"^heartbeat\.enabled: expected true or false") as err:
        load_config(path)
    assert len(str(err.value)) < 300
