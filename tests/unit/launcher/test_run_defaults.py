"""``rankguard run``'s own defaults and its torch-free pre-pass."""

from __future__ import annotations

import pytest

from rankguard.config import load_config
from rankguard.launcher.argv import nvrx_flags, pre_pass

ON = {"heartbeat.enabled": True}


def test_heartbeats_are_on_by_default_under_run_and_an_explicit_false_wins() -> None:
    assert load_config(None, [], defaults=ON).heartbeat.enabled is True
    assert load_config(None, ["heartbeat.enabled=false"], defaults=ON).heartbeat.enabled is False
    assert load_config(None, ["enable_monitoring=false"], defaults=ON).heartbeat.enabled is False
    assert load_config(None, []).heartbeat.enabled is False  # the library default stays


def test_a_file_that_turns_heartbeats_off_is_honoured(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "c.yaml"  # type: ignore[operator]
    path.write_text("experiment:\n  runner:\n    heartbeat:\n      enabled: false\n")
    assert load_config(path, [], defaults=ON).heartbeat.enabled is False


def test_the_pre_pass_reads_rankguards_words_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PET_LOG_DIR", raising=False)
    monkeypatch.delenv("PET_CONFIG", raising=False)
    pre = pre_pass(
        [
            "--rdzv-conf",
            "join_timeout=5",  # a torchrun value, not an override
            "--log-dir",
            "L",
            "--config=c.yaml",
            "--set",
            "a.b=1",
            "-r3",
            "--standalone",
            "c.d=2",
            "train.py",
            "e.f=3",
        ]
    )
    assert pre.config == "c.yaml" and pre.script == "train.py"
    assert pre.overrides == ["log_dir=L", "a.b=1", "c.d=2"]


def test_pet_variables_stand_for_rankguards_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_CONFIG", "from-env.yaml")
    monkeypatch.setenv("PET_LOG_DIR", "envlogs")
    monkeypatch.setenv("PET_NO_PYTHON", "1")
    pre = pre_pass(["t.sh"])
    assert (pre.config, pre.overrides, pre.no_python) == (
        "from-env.yaml",
        ["log_dir=envlogs"],
        True,
    )
    assert pre_pass(["--config", "flag.yaml", "t.py"]).config == "flag.yaml"  # the flag wins


def test_nvrx_flags_skip_torchruns_switches_and_values() -> None:
    argv = nvrx_flags(
        ["run", "--no-python", "--ft-safety_factor=3", "-r", "3", "x.sh", "--ft-y"],
        ("safety_factor",),
        set(),
    )
    assert argv == [
        "run",
        "--set",
        "fault_tolerance.enable_ft_package=true",  # ft_launcher's behaviour
        "--set",
        "fault_tolerance.safety_factor=3",
        "--no-python",
        "-r",
        "3",
        "x.sh",
        "--ft-y",
    ]


def test_rank_prefix_tees_every_stream_with_the_node_and_global_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.elastic.multiprocessing import Std

    from rankguard.launcher.options import RANK_PREFIX_TEMPLATE, parse_run_args

    monkeypatch.delenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", raising=False)
    opts, _ = parse_run_args(["--rank-prefix", "t.py"])
    assert opts.line_prefix_template == RANK_PREFIX_TEMPLATE and opts.notes == ()
    assert opts.logs_specs._tee == Std.ALL
    opts, _ = parse_run_args(["--rank-prefix", "--redirects", "3", "t.py"])
    assert any("NO effect" in n for n in opts.notes)
    monkeypatch.setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]")
    opts, _ = parse_run_args(["--rank-prefix", "t.py"])
    assert opts.line_prefix_template == "[${rank}]" and "wins" in opts.notes[0]


def test_torchruns_shutdown_timeout_only_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from rankguard.launcher.options import parse_run_args

    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert parse_run_args(["t.py"])[0].shutdown_timeout_s is None  # termination_grace_s
    assert parse_run_args(["--shutdown-timeout", "5", "t.py"])[0].shutdown_timeout_s == 5
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7")
    assert parse_run_args(["t.py"])[0].shutdown_timeout_s == 7


def test_the_pre_pass_refuses_no_ranks_before_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    for words in (["--nproc-per-node", "0", "t.py"], ["--nproc_per_node=-1", "t.py"]):
        with pytest.raises(ValueError, match=r"--nproc-per-node: must be >= 1"):
            pre_pass(words).check_nproc()
    for value in ("auto", "gpu", "2"):
        pre_pass(["--nproc-per-node", value, "t.py"]).check_nproc()
    monkeypatch.setenv("PET_NPROC_PER_NODE", "0")
    with pytest.raises(ValueError, match="got 0"):
        pre_pass(["t.py"]).check_nproc()
    assert pre_pass(["--log-dir", "/x", "t.py"]).log_dir == "/x"


def test_the_first_line_says_what_nvrx_section_timeouts_do() -> None:
    from rankguard.config import load_config
    from rankguard.launcher.elastic import features_line
    from rankguard.launcher.options import LaunchOptions

    opts = LaunchOptions(target="t.py")
    on = {"heartbeat.enabled": True}
    cfg = load_config(
        None,
        [
            "fault_tolerance.rank_section_timeouts=setup:6,step:3",
            "fault_tolerance.rank_out_of_section_timeout=20",
        ],
        defaults=on,
    )
    line = features_line(opts, cfg)
    assert "fault tolerance off" in line
    assert (
        "NVRx section timeouts setup 6 s, step 3 s, out of section 20 s (each phase's own "
        "limit; a hang is reported, nothing is killed or restarted)"
    ) in line
    assert "section" not in features_line(opts, load_config(None, [], defaults=on))


def test_the_first_line_says_the_standbys() -> None:
    from rankguard.config import load_config
    from rankguard.launcher.elastic import features_line
    from rankguard.launcher.options import LaunchOptions

    opts = LaunchOptions(target="t.py")
    sets = ["inprocess_restart.enabled=true", "inprocess_restart.standby_ranks=2"]
    line = features_line(opts, load_config(None, sets))
    assert "in-process restart on, live recovery: 2 standby rank(s) per node;" in line
    assert "standby" not in features_line(opts, load_config(None, []))


def test_with_standbys_the_agent_watches_the_workers_every_20_ms() -> None:
    from rankguard.launcher.elastic import monitor_interval

    assert monitor_interval(0.1, 1) == 0.02  # a live recovery starts within it
    assert monitor_interval(0.01, 1) == 0.01
    assert monitor_interval(0.1, 0) == 0.1  # torch elastic's, as asked
