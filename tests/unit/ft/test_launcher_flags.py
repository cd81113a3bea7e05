"""ft_launcher's own flags on rankguard run's command line: every flag NVRx's launcher
defines is accepted (read from the installed NVRx, else a frozen list), mapped where
rankguard has the setting, one warning line where it has no effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankguard.cli.main import _nvrx_flags
from rankguard.config import load_config
from rankguard.ft import launcher_flags
from rankguard.ft.launcher_flags import FROZEN, flag_for, translate
from rankguard.launcher.options import parse_run_args


def _sample(dest: str, tmp_path: Path) -> str | None:
    if dest == "ft_cfg_path":
        path = tmp_path / "ft.yaml"
        path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 200\n")
        return str(path)
    return {
        "ft_rank_section_timeouts": "setup:600,step:180,checkpointing:420",
        "ft_rank_termination_signal": "SIGTERM",
        "ft_log_level": "INFO",
        "ft_restart_policy": "min-healthy",
        "ft_enable_nic_monitor": "false",
        "ft_pci_topo_file": str(tmp_path / "topo.xml"),
        "ft_link_down_path_template": str(tmp_path / "{dev_name}"),
        "ft_ignore_missing_cfg": None,
        "ft_storage_healthcheck_path": str(tmp_path),
    }.get(dest, "123")


def _launch(words: list[str]) -> tuple[list[str], object]:
    argv = _nvrx_flags(["run", "--nproc-per-node", "2", *words, "train.py", "--lr", "1"])
    _opts, overrides = parse_run_args(argv[1:])
    return argv, load_config(None, overrides)


def test_every_ft_launcher_flag_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, source = launcher_flags.launcher_flags()
    assert flags, source
    # the installed NVRx (or the frozen list) has at least the frozen flags
    frozen = {o for f in FROZEN for o in f.options}
    have = {o for f in flags for o in f.options}
    assert frozen <= have, (source, sorted(frozen - have))
    for flag in flags:
        for option in flag.options:
            value = _sample(flag.dest, tmp_path)
            words = [option] if value is None else [f"{option}={value}"]
            argv, _cfg = _launch(words)
            assert argv[-3:] == ["train.py", "--lr", "1"], (option, argv)
            if value is not None and "=" not in words[0]:
                continue
            _launch([option] if value is None else [option, value])  # space form too


def test_mapped_settings_take_nvrx_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    _, cfg = _launch(
        [
            "--ft-param-rank_section_timeouts=setup:600,step:180,checkpointing:420",
            "--ft-rank-out-of-section-timeout",
            "300",
            "--ft-initial-rank-heartbeat-timeout=900",
            "--ft-rank_heartbeat_timeout=120",
            "--ft-safety-factor=3",
        ]
    )
    ft = cfg.fault_tolerance  # type: ignore[attr-defined]
    assert ft.rank_section_timeouts == {"setup": 600.0, "step": 180.0, "checkpointing": 420.0}
    assert ft.rank_out_of_section_timeout == 300.0
    assert ft.initial_rank_heartbeat_timeout == 900.0
    assert ft.rank_heartbeat_timeout == 120.0
    assert ft.safety_factor == 3.0
    assert capsys.readouterr().err == ""  # all of them take effect: no warning


def test_step_none_is_accepted_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    _, cfg = _launch(["--ft-rank_section_timeouts=setup:600,step:None"])
    assert cfg.fault_tolerance.rank_section_timeouts == {"setup": 600.0}  # type: ignore[attr-defined]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step:None" in err[0] and "progress_timeout_s" in err[0]


def test_settings_without_effect_are_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _launch(
        [
            "--term-timeout=60",
            "--ft-rank-termination-signal=SIGTERM",
            "--ft-workload-check-interval",
            "2",
            "--restart-policy=min-healthy",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4, err
    assert all("has no effect under rankguard" in line for line in err)
    assert any("term_timeout=60" in line for line in err)


def test_default_restart_policy_is_silent(capsys: pytest.CaptureFixture[str]) -> None:
    _launch(["--ft-restart-policy=any-failed"])
    assert capsys.readouterr().err == ""


def test_cfg_path_yaml_under_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ft.yaml"
    path.write_text(
        "model: {}\n"
        "trainer:\n"
        "  fault_tolerance:\n"
        "    rank_heartbeat_timeout: 200\n"
        "    rank_section_timeouts: {setup: 500, step: 90}\n"
        "    safety_factor: 4\n"
    )
    _, cfg = _launch([f"--ft-cfg-path={path}", "--ft-safety-factor=6"])
    ft = cfg.fault_tolerance  # type: ignore[attr-defined]
    assert ft.rank_heartbeat_timeout == 200.0
    assert ft.rank_section_timeouts == {"setup": 500.0, "step": 90.0}
    assert ft.safety_factor == 6.0  # the flag over the file, as NVRx reads it


def test_missing_cfg_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--ft-cfg-path"):
        _launch([f"--ft-cfg-path={tmp_path / 'nope.yaml'}"])


def test_rankguard_own_ft_keys_still_work_with_param_spelling() -> None:
    _, cfg = _launch(["--ft-param-enable_ft_package", "--ft-num_in_job_restarts=2"])
    ft = cfg.fault_tolerance  # type: ignore[attr-defined]
    assert ft.enable_ft_package is True and ft.num_in_job_restarts == 2


def test_frozen_translation_without_nvrx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher_flags, "_nvrx_settings", lambda given: None)
    given: dict[str, str | None] = {
        "--ft-param-rank_section_timeouts": "setup:600,step:null",
        "--ft-rank-heartbeat-timeout": "100",
        "--ft-log-level": "DEBUG",
    }
    out = translate(given, FROZEN)
    assert out.sets == [  # fault tolerance on (ft_launcher's behaviour), then in the order given
        "fault_tolerance.enable_ft_package=true",
        "fault_tolerance.rank_section_timeouts=setup:600",
        "fault_tolerance.rank_heartbeat_timeout=100",
    ]
    assert len(out.warnings) == 2
    assert flag_for("--ft-param-rank_section_timeouts") is not None
    assert flag_for("--nproc-per-node") is None


def test_ft_launcher_flags_turn_fault_tolerance_on_as_under_ft_launcher() -> None:
    """Under ft_launcher a rank past its section timeout is ended and the group restarted
    (or the job fails): its flags on a launch line ask for that, not for reports only."""
    _, cfg = _launch(["--ft-rank_section_timeouts=setup:60,step:4"])
    assert cfg.fault_tolerance.enable_ft_package is True  # type: ignore[attr-defined]
    _, cfg = _launch(["--term-timeout=10"])  # even a flag without effect of its own
    assert cfg.fault_tolerance.enable_ft_package is True  # type: ignore[attr-defined]


def test_the_launch_line_can_keep_ft_launcher_flags_as_reports_only() -> None:
    for off in (
        ["--set", "fault_tolerance.enable_ft_package=false"],
        ["fault_tolerance.enable_ft_package=false"],
        ["--ft-enable_ft_package=false"],
    ):
        _, cfg = _launch(["--ft-rank_section_timeouts=step:4", *off])
        assert cfg.fault_tolerance.enable_ft_package is False, off  # type: ignore[attr-defined]


def test_without_ft_launcher_flags_fault_tolerance_keeps_its_default() -> None:
    _, cfg = _launch([])
    assert cfg.fault_tolerance.enable_ft_package is False  # type: ignore[attr-defined]


def test_nvrxs_nic_and_storage_checks_are_rankguards_node_health(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, cfg = _launch(
        [
            "--ft-enable-nic-healthcheck=true",
            f"--ft-storage-health-check-path={tmp_path}/a,{tmp_path}/b",
        ]
    )
    node = cfg.node_health  # type: ignore[attr-defined]
    assert (node.enabled, node.nic, node.storage) == (True, True, True)
    assert node.storage_paths == [f"{tmp_path}/a", f"{tmp_path}/b"]
    assert capsys.readouterr().err == ""  # they take effect: no line
    _, cfg = _launch(["--ft-enable-dist-storage-healthcheck=true"])
    node = cfg.node_health  # type: ignore[attr-defined]
    assert (node.enabled, node.nic, node.storage) == (True, False, True)
    _, cfg = _launch(["--ft-enable-nic-monitor=false"])  # asked off: stays off
    assert cfg.node_health.enabled is False  # type: ignore[attr-defined]
    assert capsys.readouterr().err == ""
