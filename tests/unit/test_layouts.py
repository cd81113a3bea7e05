"""Config documents of the tools rankguard replaces: a whole FlagScale experiment file
and a Megatron Bridge ConfigContainer as its to_yaml() writes it, loaded as they are."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from rankguard.config import ConfigError, load_config
from rankguard.layouts import FLAGSCALE_TRAIN_NOTE, normalize
from rankguard.perf.flagscale import link_flagscale_summary

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _notes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rankguard.config"]


def test_whole_flagscale_experiment(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rankguard.config"):
        cfg = load_config(FIXTURES / "flagscale_experiment.yaml")
    hb = cfg.heartbeat
    assert (hb.enabled, hb.publish_interval_s, hb.process_timeout_s) == (True, 5.0, 30.0)
    assert hb.progress_timeout_s == 300.0 and hb.checkpoint_timeout_s == 1800.0
    assert hb.hardware_health.enabled is True and hb.hardware_health.interval_s == 60.0
    assert cfg.no_shared_fs is False
    assert cfg.enable_monitoring is True and cfg.perf.enabled is True
    # the training section (defaults' train), the commands, the runner's own settings:
    # one line each
    train, cmds, note = _notes(caplog)
    assert train == f"rankguard: {FLAGSCALE_TRAIN_NOTE}"
    assert "experiment.cmds" in cmds and "not run under rankguard" in cmds
    for key in ("backend", "nnodes", "nproc_per_node", "hostfile"):
        assert f"experiment.runner.{key}" in note
    assert "no effect under rankguard" in note
    # as FlagScale means them: the envs for the ranks, the log root under exp_dir
    assert cfg.envs == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_ALGO": "Ring",
        "NVTE_FWD_LAYERNORM_SM_MARGIN": "8",
    }
    assert cfg.log_dir == os.path.join("./outputs", "logs")
    assert cfg.perf.flagscale_summary_link is True


def test_flagscale_overrides_on_top_of_the_file() -> None:
    cfg = load_config(
        FIXTURES / "flagscale_experiment.yaml",
        ["experiment.runner.heartbeat.process_timeout_s=12", "experiment.exp_name=other"],
    )
    assert cfg.heartbeat.process_timeout_s == 12.0


def test_flagscale_action_run_and_training_overrides(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rankguard.config"):
        load_config(
            FIXTURES / "flagscale_experiment.yaml",
            ["action=run", "train.data.data_path=../pile", "+train.model.num_layers=2"],
        )
    notes = _notes(caplog)
    assert notes.count(f"rankguard: {FLAGSCALE_TRAIN_NOTE}") == 1, (
        notes
    )  # file and overrides: one line
    with pytest.raises(ConfigError, match=r"action=stop: rankguard run runs the job"):
        load_config(FIXTURES / "flagscale_experiment.yaml", ["action=stop"])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rankguard.config"):
        load_config(None, ["action=run", "train.data.data_path=../pile"])  # no file
    assert _notes(caplog) == [f"rankguard: {FLAGSCALE_TRAIN_NOTE}"]


def test_flagscale_envs_and_exp_dir_rules(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "experiment:\n"
        "  exp_dir: /data/exp1\n"
        "  envs: {A: 1, B: x}\n"
        "  runner: {envs: {B: y, C: 2.5}, heartbeat: {enabled: true}}\n"
    )
    cfg = load_config(path)
    assert cfg.envs == {"A": "1", "B": "y", "C": "2.5"}  # the runner's over the experiment's
    assert cfg.log_dir == "/data/exp1/logs"
    assert load_config(path, ["envs.A=9"]).envs["A"] == "9"
    assert load_config(path, ["log_dir=/elsewhere"]).log_dir == "/elsewhere"  # --log-dir
    assert load_config(path, ["experiment.exp_dir=/data/exp2"]).log_dir == "/data/exp2/logs"
    assert load_config(None).envs == {} and load_config(None).log_dir == "rankguard_logs"
    path.write_text("experiment:\n  exp_dir: /e\n  runner: {log_dir: /own}\n")
    assert load_config(path).log_dir == "/own"
    for bad, match in (
        ("  envs: {'1X': 1}\n", r"experiment.envs.1X: not an environment variable name"),
        ("  envs: {A: {b: 1}}\n", r"experiment.envs.A: expected a value"),
        ("  envs: [A]\n", r"experiment.envs: expected a mapping"),
    ):
        path.write_text("experiment:\n" + bad)
        with pytest.raises(ConfigError, match=match):
            load_config(path)


def test_flagscale_summary_link(tmp_path: Path) -> None:
    root = tmp_path / "perf_monitor"
    run = root / "run-1"
    run.mkdir(parents=True)
    summary = run / "perf_summary_20261206_001500.json"
    summary.write_text('{"a": 1}')
    link = link_flagscale_summary(summary)
    assert link == root / summary.name and link.is_symlink()
    assert os.readlink(link) == os.path.join("run-1", summary.name)  # relative
    summary.write_text('{"a": 2}')  # rewritten in the run's folder: the link follows
    assert link.read_text() == '{"a": 2}'
    assert link_flagscale_summary(summary) == link  # idempotent
    # a pruned run's link goes when the next one is made; a file of someone else stays
    other = root / "run-2"
    other.mkdir()
    (other / "perf_summary_20261206_002000.json").write_text("{}")
    summary.unlink()
    run.rmdir()
    (root / "perf_summary_20261206_003000.json").write_text("theirs")
    link_flagscale_summary(other / "perf_summary_20261206_002000.json")
    assert not os.path.lexists(link)
    assert (root / "perf_summary_20261206_002000.json").is_symlink()
    (root / "run-3").mkdir()
    assert link_flagscale_summary(root / "run-3" / "perf_summary_20261206_003000.json") is None
    assert (root / "perf_summary_20261206_003000.json").read_text() == "theirs"


def test_rankguard_section_in_the_runner_stays_strict(tmp_path: Path) -> None:
    text = (FIXTURES / "flagscale_experiment.yaml").read_text()
    path = tmp_path / "x.yaml"
    path.write_text(text.replace("      publish_interval_s: 5", "      publish_every: 5"))
    with pytest.raises(ConfigError, match=r"heartbeat.*publish_every"):
        load_config(path)


def test_megatron_bridge_config_container(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rankguard.config"):
        cfg = load_config(FIXTURES / "megatron_bridge_config.yaml")
    ft = cfg.fault_tolerance
    assert ft.enable_ft_package is True and ft.calc_ft_timeouts is True
    assert cfg.straggler.enabled is True and cfg.straggler.report_time_interval == 120.0
    assert cfg.straggler.gpu_relative_perf_threshold == 0.7
    pre = cfg.preemption
    assert pre.enable_exit_handler is True and pre.exit_signal == "SIGTERM"
    ck = cfg.checkpoint
    assert ck.save == "/ckpt/run1" and ck.async_save is True and ck.save_interval == 100
    assert ck.most_recent_k is None  # Bridge's -1: keep every checkpoint
    assert cfg.rerun_state_machine.rerun_mode == "validate_results"
    assert cfg.inprocess_restart.enabled is True
    assert cfg.inprocess_restart.soft_timeout == 60.0 and cfg.inprocess_restart.hard_timeout == 90.0
    notes = _notes(caplog)
    # Bridge's checkpoint.load was set (not its default): said, with the reason
    assert any("checkpoint.load='/ckpt/run1'" in n for n in notes), notes
    # every other Bridge-only field sits at Bridge's default: nothing to say about it
    assert not any("inprocess_restart." in n for n in notes), notes
    assert not any("logger_name" in n for n in notes), notes


def test_bridge_names_as_overrides() -> None:
    cfg = load_config(
        None,
        [
            "ft.enable_ft_package=true",
            "nvrx_straggler.enabled=true",
            "train.exit_signal_handler=true",
            "train.exit_signal=SIGUSR1",
            "train.train_iters=10",
            "inprocess_restart.max_rank_faults=2",
        ],
    )
    assert cfg.fault_tolerance.enable_ft_package is True
    assert cfg.straggler.enabled is True
    assert cfg.preemption.enable_exit_handler is True and cfg.preemption.exit_signal == "SIGUSR1"


def test_rankguard_name_wins_over_the_bridge_alias() -> None:
    cfg = load_config(None, ["ft.num_in_job_restarts=1", "fault_tolerance.num_in_job_restarts=3"])
    assert cfg.fault_tolerance.num_in_job_restarts == 3


def test_unknown_key_in_a_bridge_section_is_still_an_error() -> None:
    with pytest.raises(ConfigError, match=r"fault_tolerance.*bogus"):
        load_config(None, ["ft.bogus=1"])


def test_legacy_straggler_section_is_left_alone_and_said_when_on() -> None:
    doc, notes = normalize({"straggler": {"log_straggler": True, "straggler_minmax_count": 1}})
    assert "straggler" not in doc
    assert len(notes) == 1 and "nvrx_straggler" in notes[0]
    doc, notes = normalize({"straggler": {"log_straggler": False}})
    assert doc == {} and notes == []
