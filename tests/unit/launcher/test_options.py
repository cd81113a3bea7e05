"""`rankguard run` argument handling and the CLI surface."""

from __future__ import annotations

import argparse

import pytest

from rankguard.cli.main import build_parser
from rankguard.config import ConfigError, load_config
from rankguard.launcher.checks import LaunchChecks, check_launch
from rankguard.launcher.options import LaunchOptions, parse_run_args, split_overrides


def parse(*argv: str) -> tuple[LaunchOptions, list[str]]:
    return parse_run_args(list(argv))


def test_torchrun_flag_names_and_script_args_pass_through() -> None:
    opts, overrides = parse(
        "--nproc_per_node", "4", "--max_restarts", "2", "train.py", "--lr", "3e-4", "-x"
    )
    assert opts.nproc_per_node == 4 and opts.max_restarts == 2
    assert opts.target == "train.py" and opts.target_args == ["--lr", "3e-4", "-x"]
    assert opts.standalone and not opts.multi_node
    assert opts.expected_world_size == 4
    assert overrides == []


def test_bare_overrides_before_the_script_and_set_flags_are_config() -> None:
    opts, overrides = parse(
        "--set",
        "heartbeat.scan_interval_s=2",
        "--log-dir",
        "/tmp/x",
        "heartbeat.enabled=true",
        "experiment.runner.heartbeat.publish_interval_s=1",
        "train.py",
        "a=b",
    )
    assert opts.target == "train.py" and opts.target_args == ["a=b"]
    assert overrides == [
        "log_dir=/tmp/x",
        "heartbeat.scan_interval_s=2",
        "heartbeat.enabled=true",
        "experiment.runner.heartbeat.publish_interval_s=1",
    ]
    cfg = load_config(None, overrides)
    assert cfg.heartbeat.enabled and cfg.heartbeat.publish_interval_s == 1.0
    assert cfg.log_dir == "/tmp/x"


def test_module_mode() -> None:
    opts, _ = parse("-m", "pkg.train", "--epochs", "1")
    assert opts.module and opts.target == "pkg.train" and opts.target_args == ["--epochs", "1"]


def test_split_overrides_needs_a_script() -> None:
    with pytest.raises(ValueError, match="no training script"):
        split_overrides("heartbeat.enabled=true", [])


def test_a_script_named_like_an_override_is_still_the_script() -> None:
    assert split_overrides("a=b.py", ["x"]) == ([], "a=b.py", ["x"])


def test_elastic_range_has_no_fixed_world_size() -> None:
    opts, _ = parse(
        "--nnodes",
        "1:4",
        "--node-rank",
        "0",
        "--rdzv-endpoint",
        "127.0.0.1:1",
        "--rdzv-id",
        "j",
        "t.py",
    )
    assert (opts.min_nodes, opts.max_nodes) == (1, 4)
    assert opts.expected_world_size is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "2", "--rdzv-backend", "c10d", "t.py"], "--rdzv-endpoint"),
        (["--no-python", "-m", "t.py"], "--no-python and --module"),
        (["--nproc-per-node", "many", "t.py"], "--nproc-per-node"),
        (
            [
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "--rdzv-endpoint",
                "h:1",
                "--rdzv-id",
                "j",
                "t.py",
            ],
            "--node-rank",
        ),
        (["--nproc-per-node", "0", "t.py"], "--nproc-per-node"),
        (["--nnodes", "3:2", "t.py"], "--nnodes"),
        (["--max-restarts", "-1", "t.py"], "--max-restarts"),
        (
            ["--standalone", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-id", "j", "t.py"],
            "--standalone",
        ),
    ],
)
def test_bad_launch_options_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(*argv)


def test_bad_nnodes_text_is_an_argparse_error() -> None:
    with pytest.raises((argparse.ArgumentTypeError, SystemExit, ValueError)):
        parse("--nnodes", "two", "t.py")


def test_master_addr_and_port_make_the_rendezvous_endpoint() -> None:
    opts, _ = parse(
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "1234",
        "--rdzv-id",
        "j",
        "t.py",
    )
    assert opts.rdzv_endpoint == "10.0.0.1:1234"


def test_cli_surface_is_frozen() -> None:
    """Changing a command or flag name breaks users' scripts: do it on purpose only.
    ``rankguard run`` has every flag of torchrun's parser plus exactly these."""
    from torch.distributed.run import get_args_parser

    from rankguard.launcher.options import build_run_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == ["demo", "goodput", "logs", "report", "run", "slurm", "status"]
    torch_flags = {o for a in get_args_parser()._actions for o in a.option_strings}
    run_flags = {o for a in build_run_parser()._actions for o in a.option_strings}
    assert torch_flags <= run_flags
    assert sorted(run_flags - torch_flags) == sorted(
        [
            "--config",
            "--set",
            "--preload",
            "--standby-ranks",
            "--live",
            "--rank-prefix",
            "--run-id",
            "--rdzv-join-timeout",
        ]
    )


def test_unknown_config_key_from_the_command_line_is_an_error() -> None:
    _, overrides = parse("heartbeat.publish_intervl_s=1", "t.py")
    with pytest.raises(ConfigError, match=r"heartbeat\.publish_intervl_s"):
        load_config(None, overrides)


def test_nvrx_ft_launcher_flags_are_fault_tolerance_overrides() -> None:
    from rankguard.cli.main import _nvrx_flags

    argv = _nvrx_flags(
        [
            "run",
            "--ft-rank_section_timeouts=setup:600,step:180,checkpointing:420",
            "--ft-rank_out_of_section_timeout=300",
            "train.py",
            "--ft-not-mine=1",
        ]
    )
    assert argv == [
        "run",
        "--set",
        "fault_tolerance.enable_ft_package=true",  # ft_launcher's behaviour
        "--set",
        "fault_tolerance.rank_section_timeouts=setup:600,step:180,checkpointing:420",
        "--set",
        "fault_tolerance.rank_out_of_section_timeout=300",
        "train.py",
        "--ft-not-mine=1",
    ]
    opts, overrides = parse_run_args(argv[1:])
    cfg = load_config(None, overrides)
    assert cfg.fault_tolerance.rank_section_timeouts == {
        "setup": 600.0,
        "step": 180.0,
        "checkpointing": 420.0,
    }
    assert cfg.fault_tolerance.rank_out_of_section_timeout == 300.0
    assert opts.target_args == ["--ft-not-mine=1"]


def test_preload_modules_are_a_comma_list() -> None:
    assert parse("t.py")[0].preload == ()
    opts, _ = parse("--preload", "torch, numpy,,", "t.py")
    assert opts.preload == ("torch", "numpy")


@pytest.mark.parametrize("bad", ["torch;rm", "1torch", "torch..nn", "a b"])
def test_preload_names_must_be_module_names(bad: str) -> None:
    with pytest.raises(ValueError, match="--preload"):
        parse("--preload", bad, "t.py")


def _checks(argv: list[str], config: list[str]) -> LaunchChecks:
    opts, overrides = parse(*argv, "t.py")
    return check_launch(opts, load_config(None, [*overrides, *config]))


HB_ON = ["heartbeat.enabled=true"]
TWO_NODES = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "j"]


def test_no_restarts_no_warnings() -> None:
    assert _checks([], HB_ON) == LaunchChecks(0, ())


def test_max_restarts_and_num_in_job_restarts_that_disagree_are_an_error() -> None:
    with pytest.raises(ValueError) as err:
        _checks(["--max-restarts", "2"], ["fault_tolerance.num_in_job_restarts=3"])
    assert str(err.value) == (
        "--max-restarts 2 and fault_tolerance.num_in_job_restarts=3 disagree: give one of them"
    )


@pytest.mark.parametrize(
    ("argv", "config", "budget"),
    [
        (["--max-restarts", "2"], [], 2),
        ([], ["fault_tolerance.num_in_job_restarts=3"], 3),
        (["--max-restarts", "3"], ["fault_tolerance.num_in_job_restarts=3"], 3),
    ],
)
def test_either_restart_setting_gives_the_budget(
    argv: list[str], config: list[str], budget: int
) -> None:
    ft_on = [*HB_ON, "fault_tolerance.enable_ft_package=true"]
    assert _checks(argv, [*config, *ft_on]) == LaunchChecks(budget, ())


def test_restarts_without_the_ft_package_are_for_crashes_only() -> None:
    checked = _checks([], [*HB_ON, "fault_tolerance.num_in_job_restarts=2"])
    assert checked.warnings == (
        "2 in-job restart(s) for crashes only: hangs found by the monitor are reported, "
        "not restarted (set fault_tolerance.enable_ft_package=true)",
    )
    # Without the monitor there is nothing to say about hangs (the config warns instead).
    assert _checks(["--max-restarts", "2"], []).warnings == ()


def test_unrelayed_heartbeats_warn_on_the_other_nodes_only() -> None:
    message = (
        "no_shared_fs=false: this node's heartbeats are NOT relayed; node 0 sees them "
        "only if log_dir is on a filesystem shared with it"
    )
    shared = [*HB_ON, "no_shared_fs=false"]
    assert _checks([*TWO_NODES, "--node-rank", "1"], shared).warnings == (message,)
    assert _checks([*TWO_NODES, "--node-rank", "0"], shared).warnings == ()
    assert _checks([*TWO_NODES, "--node-rank", "1"], HB_ON).warnings == ()
    assert _checks([*TWO_NODES, "--node-rank", "1"], ["no_shared_fs=false"]).warnings == ()


@pytest.mark.parametrize("nnodes", ["2", "1:3"])
def test_several_nodes_without_node_rank_leave_it_to_the_rendezvous(nnodes: str) -> None:
    # As torchrun with c10d: the rendezvous numbers the nodes (the agent's group rank).
    c10d = ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1"]
    opts, _ = parse(*c10d, "--rdzv-id", "j", "t.py")
    assert opts.node_rank is None
    shared = [*HB_ON, "no_shared_fs=false"]
    unknown = _checks([*c10d, "--rdzv-id", "j"], shared)
    assert unknown.warnings == (
        "no_shared_fs=false: heartbeats of nodes > 0 are NOT relayed; node 0 sees them "
        "only if log_dir is on a filesystem shared with it",
    )


def test_static_backend_keeps_torchruns_node_rank_and_default_run_id() -> None:
    # torchrun's default backend is static: --node-rank (default 0) is the group rank,
    # and the run id defaults to "none" on every node
    opts, _ = parse("--nnodes", "2", "--rdzv-endpoint", "h:1", "t.py")
    assert (opts.rdzv_backend, opts.node_rank, opts.rdzv_endpoint) == ("static", 0, "h:1")
    assert opts.run_id() == "none"
    assert opts.rdzv_conf["rank"] == 0


def test_one_node_needs_no_node_rank() -> None:
    opts, _ = parse("--nproc-per-node", "2", "t.py")
    assert opts.node_rank == 0
    opts, _ = parse(
        "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1", "--rdzv-id", "j", "t.py"
    )
    assert opts.node_rank == 1


def test_nvrx_flags_after_a_bare_override_and_in_the_space_form() -> None:
    from rankguard.cli.main import _nvrx_flags

    argv = _nvrx_flags(
        [
            "run",
            "--nproc-per-node",
            "2",
            "heartbeat.enabled=true",
            "--ft-rank_section_timeouts=setup:600,step:180,checkpointing:420",
            "--ft-rank_out_of_section_timeout",
            "300",
            "+heartbeat.progress_timeout_s=40",
            "train.py",
            "--ft-rank_out_of_section_timeout",
            "7",
        ]
    )
    opts, overrides = parse_run_args(argv[1:])
    cfg = load_config(None, overrides)
    assert opts.target == "train.py" and opts.nproc_per_node == 2
    assert opts.target_args == ["--ft-rank_out_of_section_timeout", "7"]  # the script's own
    assert cfg.heartbeat.enabled is True
    assert cfg.heartbeat.progress_timeout_s == 40.0  # Hydra's +key=value
    assert cfg.fault_tolerance.rank_section_timeouts == {
        "setup": 600.0,
        "step": 180.0,
        "checkpointing": 420.0,
    }
    assert cfg.fault_tolerance.rank_out_of_section_timeout == 300.0


def test_nvrx_flags_stop_at_the_module_and_skip_option_values() -> None:
    from rankguard.cli.main import _nvrx_flags

    argv = _nvrx_flags(["run", "--log-dir", "x", "--ft-safety_factor=3", "-m", "pkg", "--ft-y"])
    assert argv == [
        "run",
        "--set",
        "fault_tolerance.enable_ft_package=true",  # ft_launcher's behaviour
        "--set",
        "fault_tolerance.safety_factor=3",
        "--log-dir",
        "x",
        "-m",
        "pkg",
        "--ft-y",
    ]
    switch = _nvrx_flags(["run", "--ft-enable_ft_package", "t.py"])
    assert switch == ["run", "--set", "fault_tolerance.enable_ft_package=true", "t.py"]


def test_misspelt_nvrx_flag_is_an_error_naming_it() -> None:
    from rankguard.cli.main import _nvrx_flags, main

    misspelt = r"--ft-rank_section_timeout: .*--ft-rank_section_timeouts"
    with pytest.raises(ValueError, match=misspelt):
        _nvrx_flags(["run", "--ft-rank_section_timeout=setup:6", "t.py"])
    with pytest.raises(ValueError, match=r"--ft-safety_factor: expected a value"):
        _nvrx_flags(["run", "--ft-safety_factor"])
    assert main(["run", "--ft-bogus=1", "t.py"]) == 2


@pytest.mark.parametrize("unset", ["none", "null", "None"])
def test_none_unsets_an_optional_timeout(unset: str) -> None:
    cfg = load_config(
        None,
        [
            "fault_tolerance.rank_out_of_section_timeout=60",
            f"fault_tolerance.rank_out_of_section_timeout={unset}",
        ],
    )
    assert cfg.fault_tolerance.rank_out_of_section_timeout is None
    with pytest.raises(ConfigError, match=r"heartbeat\.progress_timeout_s"):
        load_config(None, ["heartbeat.progress_timeout_s=none"])


def test_exclusion_that_cannot_act_fully_is_said() -> None:
    elastic = ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1"]
    on = ["fault_tolerance.exclude_bad_nodes=true", "fault_tolerance.exclude_after_restarts=3"]
    assert _checks([*elastic, "--rdzv-id", "j", "--max-restarts", "3"], on).warnings == ()
    said = " | ".join(_checks([*TWO_NODES], on).warnings)
    assert "MIN = MAX" in said  # an exclusion ends the job
    assert "more than the in-job restart budget (0)" in said
    assert "no in-job restart" in said
    static = ["--nnodes", "1:2", "--max-restarts", "3"]  # torchrun's default backend
    (said,) = _checks(static, ["fault_tolerance.exclude_bad_nodes=true"]).warnings
    assert said.startswith("bad-node exclusion with --rdzv-backend static: the group is fixed")


def test_standby_ranks_flag_is_the_config_key() -> None:
    _opts, overrides = parse_run_args(["--standby-ranks", "2", "t.py"])
    assert overrides[-1] == "inprocess_restart.standby_ranks=2"
    with pytest.raises(ValueError, match="--standby-ranks: must be >= 0"):
        parse_run_args(["--standby-ranks", "-1", "t.py"])


@pytest.mark.parametrize(
    ("argv", "config", "says"),
    [
        (["--standby-ranks", "1"], [], "set inprocess_restart.enabled=true"),
        (
            ["--standby-ranks", "1", "--no-python"],
            ["inprocess_restart.enabled=true"],
            "not with --no-python",
        ),
    ],
)
def test_standbys_where_they_cannot_work_are_refused_before_the_launch(
    argv: list[str], config: list[str], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        _checks(argv, config)


@pytest.mark.parametrize("preload", [[], ["--preload", "torch"]])
def test_standbys_with_inprocess_restart_are_accepted(preload: list[str]) -> None:
    # with --preload the standbys are forked from the fork server as the ranks are
    checked = _checks(["--standby-ranks", "1", *preload], ["inprocess_restart.enabled=true"])
    assert checked.max_restarts == 0


def test_standbys_with_preload_on_a_torch_whose_forked_workers_differ_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What live recovery uses of torch elastic's forked workers is not its public
    interface: a torch without it gets one line before the launch, not a failure at
    the first lost rank."""
    from torch.distributed.elastic.multiprocessing import api

    def renamed(self: object, *args: object, **kw: object) -> None:
        self._results = {}  # type: ignore[attr-defined]

    monkeypatch.setattr(api.MultiprocessContext, "__init__", renamed)
    with pytest.raises(ValueError, match=r"not with --preload on this torch .*_ret_vals"):
        _checks(["--standby-ranks", "1", "--preload", "torch"], ["inprocess_restart.enabled=true"])
    _checks(["--standby-ranks", "1"], ["inprocess_restart.enabled=true"])  # without: as before
