"""Run directories: created with ``run_dir_mode``, refused when another user owns them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankguard.config import ConfigError, RankguardConfig, load_config
from rankguard.launcher.exitcodes import EXIT_USAGE
from rankguard.launcher.options import LaunchOptions
from rankguard.launcher.run import launch, run_dir_for
from rankguard.launcher.rundir import ForeignDirectoryError, owner_name, prepare_run_dir
from rankguard.monitor.agree import write_control
from rankguard.schema.layout import CONTROL_FILE
from tests.factories import STORE_CONNECT_TIMEOUT


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _another_uid(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make this process look like another user: what it created is someone else's."""
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 4242)
    return real


def test_directories_are_created_0750_by_default(tmp_path: Path, umask_022: None) -> None:
    cfg = RankguardConfig(log_dir=str(tmp_path / "logs"))
    run_dir = run_dir_for(cfg, "run-a")
    prepare_run_dir(Path(cfg.log_dir), run_dir, cfg.dir_mode())
    assert run_dir.is_dir()
    for path in (tmp_path / "logs", tmp_path / "logs" / "heartbeat", run_dir):
        assert _mode(path) == 0o750, path


def test_the_mode_is_configurable_and_wins_over_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        cfg = load_config(None, [f"log_dir={tmp_path / 'logs'}", "run_dir_mode='0755'"])
        run_dir = run_dir_for(cfg, "run-b")
        prepare_run_dir(Path(cfg.log_dir), run_dir, cfg.dir_mode())
    finally:
        os.umask(old)
    assert _mode(run_dir) == 0o755


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    os.chmod(logs, 0o711)
    prepare_run_dir(logs, logs / "heartbeat" / "r", 0o750)
    assert _mode(logs) == 0o711


@pytest.mark.parametrize(
    ("value", "bits"), [("0750", 0o750), ("700", 0o700), ("0o755", 0o755), (0o750, 0o750)]
)
def test_run_dir_mode_values(value: str | int, bits: int) -> None:
    assert RankguardConfig(run_dir_mode=value).dir_mode() == bits


@pytest.mark.parametrize("value", ["abc", "0650", "07777", "1", "750x", 750, "0o1750"])
def test_run_dir_mode_is_validated(value: str | int) -> None:
    with pytest.raises(ConfigError, match="run_dir_mode"):
        RankguardConfig(run_dir_mode=value)


def test_a_run_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "logs"
    run_dir = logs / "heartbeat" / "planted"
    run_dir.mkdir(parents=True)
    real = _another_uid(monkeypatch)
    with pytest.raises(ForeignDirectoryError) as err:
        prepare_run_dir(logs, run_dir, 0o750)
    assert err.value.uid == real
    assert str(logs) in str(err.value)  # the first foreign one: the log dir itself


def test_a_foreign_run_directory_inside_our_log_dir_is_named(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    logs = tmp_path / "logs"
    prepare_run_dir(logs, logs / "heartbeat" / "mine", 0o750)
    planted = logs / "heartbeat" / "planted"
    planted.mkdir()
    os.chown(planted, 65534, 65534)
    with pytest.raises(ForeignDirectoryError, match="planted") as err:
        prepare_run_dir(logs, planted, 0o750)
    assert owner_name(65534) in str(err.value)


def test_launch_refuses_a_log_dir_of_another_user_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    real = _another_uid(monkeypatch)
    opts = LaunchOptions(target="train.py", rdzv_id="run-c", standalone=True)
    code = launch(opts, RankguardConfig(log_dir=str(logs)))
    assert code == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert str(logs) in err and f"uid {real}" in err and owner_name(real) in err
    assert not (logs / "heartbeat").exists()  # nothing written there


@pytest.mark.parametrize("run_id", ["../../x", "a\nb", "..", ".hidden", "-rf", "", "x" * 201])
def test_a_run_id_that_is_not_one_plain_name_is_refused(tmp_path: Path, run_id: str) -> None:
    from rankguard.launcher.rundir import check_run_id
    from rankguard.schema.layout import run_dir

    with pytest.raises(ValueError, match="rdzv-id"):
        check_run_id(run_id)
    if run_id:
        with pytest.raises(ValueError, match="rdzv-id"):
            prepare_run_dir(tmp_path / "logs", run_dir(tmp_path / "logs", run_id), 0o750)
    assert not (tmp_path / "x").exists()


def test_usual_run_ids_are_accepted() -> None:
    from rankguard.launcher.rundir import check_run_id

    for run_id in ("20261201-120000-abc123", "12345_7", "job.3", "none", "a:b@c+d=e"):
        assert check_run_id(run_id) == run_id


def test_a_directory_nothing_can_be_created_in_is_refused_naming_it(tmp_path: Path) -> None:
    from rankguard.launcher.rundir import check_creatable

    check_creatable(tmp_path / "a" / "b", "log_dir")  # creatable: nothing is left behind
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"log_dir .*/f/x: .*/f is not a directory"):
        check_creatable(tmp_path / "f" / "x", "log_dir")
    if os.path.isdir("/proc"):  # access() says writable for root; mkdir fails
        with pytest.raises(ValueError, match=r"^--log-dir /proc/x/y: cannot be created"):
            check_creatable("/proc/x/y", "--log-dir")


def test_a_default_run_id_gets_a_directory_of_each_launch_agreed_through_the_store(
    tmp_path: Path,
) -> None:
    from torch.distributed import TCPStore

    from rankguard.launcher.rundir import agreed_name, launch_name, link_latest

    a, b = launch_name("none"), launch_name("none")
    assert a != b and a.startswith("none-")
    host = TCPStore("127.0.0.1", 0, is_master=True, timeout=STORE_CONNECT_TIMEOUT)
    peer = TCPStore("127.0.0.1", host.port, is_master=False, timeout=STORE_CONNECT_TIMEOUT)
    assert agreed_name(host, "k", a) == a and agreed_name(peer, "k", b) == a
    peer.set("bad", "../../etc")
    with pytest.raises(ValueError, match="run id"):
        agreed_name(peer, "bad", b)
    assert link_latest(tmp_path, a) and os.readlink(tmp_path / "latest") == a
    assert link_latest(tmp_path, b) and os.readlink(tmp_path / "latest") == b
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "latest").mkdir()  # a run named latest: left alone
    assert not link_latest(tmp_path / "other", a)
    assert (tmp_path / "other" / "latest").is_dir()


def test_an_earlier_launchers_stop_step_is_not_this_ones(tmp_path: Path) -> None:
    """A requeued Slurm job keeps its job id, the run id: the stop step its previous
    launcher agreed on (control.json) would stop the resumed ranks that many steps in."""
    logs = tmp_path / "logs"
    run_dir = logs / "heartbeat" / "4242"
    prepare_run_dir(logs, run_dir, 0o750)
    write_control(run_dir, 102, "preempted: node 0's launcher received SIGTERM")
    prepare_run_dir(logs, run_dir, 0o750)  # the requeued job's launcher
    assert not (run_dir / CONTROL_FILE).exists()


def test_a_launcher_joining_a_running_job_keeps_its_stop_step(tmp_path: Path) -> None:
    """On a shared log directory another node's launcher, or a hot spare starting late,
    prepares the same run directory while the job runs: the stop step node 0 agreed on
    is the live one, and the ranks still to read it must find it."""
    logs = tmp_path / "logs"
    run_dir = logs / "heartbeat" / "4242"
    prepare_run_dir(logs, run_dir, 0o750)
    write_control(run_dir, 102, "preempted: node 0's launcher received SIGTERM")
    prepare_run_dir(logs, run_dir, 0o750, first=False)  # a spare joining now
    assert (run_dir / CONTROL_FILE).exists()
