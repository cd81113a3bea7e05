"""The in-loop API: Session, NullSession and init()."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import rankguard
from rankguard.bootstrap import init
from rankguard.config import RankguardConfig, dumps_config
from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank import ranksession
from rankguard.rank.identity import ENV
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.layout import heartbeat_file_name
from rankguard.session import NullSession, Session, current
from tests.factories import rank_identity
from tests.factories import read_records as _records

RUN = "run-session"


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    s = Session(
        rank_identity(run_id=RUN),
        tmp_path,
        HeartbeatConfig(publish_interval_s=0.05),
        tracker=ProgressTracker(mode="cpu"),
    )
    try:
        yield s
    finally:
        s.close()


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train_step(model: torch.nn.Module, *optimizers: torch.optim.Optimizer) -> None:
    loss = model(torch.ones(2, 3)).sum()
    loss.backward()
    for opt in optimizers:
        opt.step()
        opt.zero_grad()


def test_session_publishes_from_construction(session: Session, tmp_path: Path) -> None:
    path = tmp_path / heartbeat_file_name(0, os.getpid())
    assert session.enabled is True
    assert _records(path)[0]["event"] == "process_start"
    session.close(clean=True, exit_code=0)
    end = _records(path)[-1]
    assert end["event"] == "process_end"
    assert end["exit"] == {"clean": True, "exit_code": 0, "error": None}


def test_step_end_advances(session: Session) -> None:
    session.step_end()
    session.step_end(7)
    assert session.tracker.progress_seq == 2
    assert session.tracker.iteration == 7


def test_step_context_sets_train_and_advances_on_success(session: Session) -> None:
    assert session.tracker.phase == "setup"
    with session.step(1):
        assert session.tracker.phase == "train"
        assert session.tracker.progress_seq == 0
    assert session.tracker.progress_seq == 1
    assert session.tracker.iteration == 1
    with session.step():
        pass
    assert session.tracker.progress_seq == 2
    assert session.tracker.iteration == 2
    assert session.tracker.phase == "train"


def test_step_context_does_not_advance_on_exception(session: Session) -> None:
    with session.step(1):
        pass
    with pytest.raises(RuntimeError, match="bad batch"), session.step(2):
        raise RuntimeError("bad batch")
    assert session.tracker.progress_seq == 1
    assert session.tracker.iteration == 1


def test_phase_context_restores(session: Session) -> None:
    session.set_phase("train")
    with session.phase("eval"):
        assert session.tracker.phase == "eval"
    assert session.tracker.phase == "train"
    with pytest.raises(KeyError), session.phase("eval"):
        raise KeyError("x")
    assert session.tracker.phase == "train"
    assert session.tracker.progress_seq == 0


def test_checkpoint_context(session: Session, tmp_path: Path) -> None:
    path = tmp_path / heartbeat_file_name(0, os.getpid())

    def published_checkpoint() -> bool:
        return any(r["checkpoint_active"] and r["checkpoint_id"] == "c1" for r in _records(path))

    session.set_phase("train")
    session.step_end()
    with session.checkpoint("c1"):
        assert session.tracker.phase == "checkpointing"
        assert session.tracker.checkpoint_active is True
        assert session.tracker.checkpoint_id == "c1"
        assert session.tracker.progress_seq == 1
        deadline = time.monotonic() + 1.0
        while not published_checkpoint() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert published_checkpoint()
    assert session.tracker.phase == "train"
    assert session.tracker.checkpoint_active is False
    assert session.tracker.progress_seq == 2
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and _records(path)[-1]["checkpoint_active"]:
        time.sleep(0.01)
    last = _records(path)[-1]
    assert last["checkpoint_active"] is False and last["phase"] == "train"
    session.close()
    end = _records(path)[-1]
    assert end["checkpoint_active"] is False and end["phase"] == "train"


@pytest.mark.parametrize("phase", ["train", "eval", None])
def test_closing_is_a_phase_of_its_own(session: Session, tmp_path: Path, phase: str | None) -> None:
    """What runs after the script returned (the perf summary, the trackers' flush) is
    published as ``closing``: the monitor gives it the checkpoint timeout, not the step's
    (a tracker's flush of several seconds was reported as a hang in train). The end
    record names the phase the script ended in (None: a script that never set one, in
    train after its first step)."""
    path = tmp_path / heartbeat_file_name(0, os.getpid())
    if phase is not None:
        session.set_phase(phase)
    session.step_end()
    seen: list[tuple[str, bool]] = []

    def published_closing() -> bool:
        return any(r.get("phase") == "closing" for r in _records(path))

    class Perf:
        def close(self) -> None:
            deadline = time.monotonic() + 2.0
            while not published_closing() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append((session.tracker.phase, published_closing()))

    session.perf = Perf()  # type: ignore[assignment]
    session.close(clean=True, exit_code=0)
    assert seen == [("closing", True)]
    end = _records(path)[-1]
    assert end["event"] == "process_end" and end["phase"] == (phase or "train")
    assert end["progress_seq"] == 1


def test_checkpoint_start_end_methods(session: Session) -> None:
    session.checkpoint_end()  # without start: nothing
    assert session.tracker.progress_seq == 0
    session.checkpoint_start("c2")
    assert session.tracker.checkpoint_active
    session.checkpoint_end()
    assert session.tracker.progress_seq == 1


def test_optimizer_hook_counts_steps(session: Session, tmp_path: Path) -> None:
    model, opt = _model_and_optimizer()
    session.install_optimizer_hook()
    session.install_optimizer_hook()  # idempotent: still one progress per step
    assert session.tracker.source == "optimizer_hook"
    for _ in range(3):
        _train_step(model, opt)
    assert session.tracker.progress_seq == 3
    session.close()
    assert _records(tmp_path / heartbeat_file_name(0, os.getpid()))[-1]["progress_source"] == (
        "optimizer_hook"
    )
    _train_step(model, opt)  # after close the global hook is gone
    assert session.tracker.progress_seq == 3


def test_two_optimizers_one_progress_per_iteration(session: Session) -> None:
    model_a, opt_a = _model_and_optimizer()
    model_b = torch.nn.Linear(3, 1)
    opt_b = torch.optim.Adam(model_b.parameters(), lr=0.01)
    session.install_optimizer_hook()
    for _ in range(4):
        _train_step(model_a, opt_a)
        _train_step(model_b, opt_b)
    assert session.tracker.progress_seq == 4


def test_explicit_step_end_removes_hook(session: Session) -> None:
    model, opt = _model_and_optimizer()
    session.install_optimizer_hook()
    _train_step(model, opt)
    assert session.tracker.progress_seq == 1
    session.step_end(10)
    assert session.tracker.source == "api"
    assert session.tracker.progress_seq == 2
    for _ in range(3):
        _train_step(model, opt)  # no longer counted
    assert session.tracker.progress_seq == 2
    assert session.tracker.iteration == 10


def test_api_progress_source_without_hook(session: Session) -> None:
    session.step_end()
    assert session.tracker.progress_seq == 1
    assert session.tracker.source == "api"


def test_null_session_is_a_noop() -> None:
    s = NullSession()
    assert s.enabled is False
    s.step_end()
    s.step_end(3)
    with s.step(1) as value:
        assert value is None
    with s.phase("eval"):
        pass
    with s.checkpoint("c"):
        pass
    with pytest.raises(ValueError), s.step():
        raise ValueError("propagates")
    s.set_phase("train")
    s.checkpoint_start("c")
    s.checkpoint_end()
    s.install_optimizer_hook()
    model, opt = _model_and_optimizer()
    _train_step(model, opt)
    s.close(clean=False, exit_code=1, error="x")


_ENV_VARS = (
    ENV.RUN_ID,
    ENV.RUN_DIR,
    ENV.NODE_RANK,
    ENV.CONFIG,
    ENV.LAUNCHER,
    ENV.LOG_DIR,
    "TORCHELASTIC_RUN_ID",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ranksession, "_current", None)
    return monkeypatch


def test_init_outside_launcher_is_null(clean_env: pytest.MonkeyPatch) -> None:
    assert current() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = init()
    assert isinstance(s, NullSession)
    assert init() is s
    assert current() is s
    assert rankguard.init is init


def test_init_under_plain_torchrun_measures_in_rank_and_says_what_is_missing(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("TORCHELASTIC_RUN_ID", "abc")
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    clean_env.setenv(ENV.LOG_DIR, str(tmp_path))
    with caplog.at_level("WARNING", logger="rankguard.session"):
        s = init()
    try:
        assert isinstance(s, Session) and s.publisher is None and s.perf is not None
        assert s.detector is not None
        notices = [r for r in caplog.records if "rankguard run" in r.getMessage()]
        assert len(notices) == 1 and str(tmp_path) in notices[0].getMessage()
        model, opt = _model_and_optimizer()
        for _ in range(3):
            _train_step(model, opt)
        assert s.tracker.progress_seq == 3  # the optimizer hook counts steps
    finally:
        s.close()
    assert s.perf.global_samples == 2  # detected from the first input (2 x 3 floats)
    (summary,) = (tmp_path / "perf_monitor" / "abc").glob("perf_summary_*.json")
    assert summary.is_file()
    assert not any(tmp_path.glob("heartbeat"))


def test_init_under_plain_torchrun_other_ranks_say_nothing(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default --rdzv-id
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv(ENV.LOG_DIR, str(tmp_path))
    with caplog.at_level("WARNING", logger="rankguard.session"):
        s = init()
    s.close()
    assert isinstance(s, Session) and s.identity.run_id == "torchrun"
    assert not caplog.records
    assert list(tmp_path.iterdir()) == []  # only rank 0 writes perf files


def test_init_with_launcher_but_heartbeat_disabled(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv(ENV.RUN_DIR, str(tmp_path))
    clean_env.setenv(ENV.LAUNCHER, "1")
    cfg = RankguardConfig()
    cfg.perf.enabled = False
    clean_env.setenv(ENV.CONFIG, dumps_config(cfg))
    assert isinstance(init(), NullSession)
    assert list(tmp_path.iterdir()) == []


def test_init_with_perf_only_measures_without_heartbeat_files(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run_dir = tmp_path / "heartbeat" / "r1"
    run_dir.mkdir(parents=True)
    clean_env.setenv(ENV.RUN_DIR, str(run_dir))
    clean_env.setenv(ENV.RUN_ID, "r1")
    clean_env.setenv(ENV.LOG_DIR, str(tmp_path))
    clean_env.setenv(ENV.LAUNCHER, "1")
    clean_env.setenv(ENV.CONFIG, dumps_config(RankguardConfig()))  # perf on, heartbeat off
    s = init()
    assert isinstance(s, Session) and s.publisher is None and s.perf is not None
    for i in range(1, 11):
        s.step_end(i)
    s.close()
    assert list(run_dir.iterdir()) == []  # no heartbeat file
    perf_dir = tmp_path / "perf_monitor" / "r1"
    assert (perf_dir / "perf.jsonl").exists()
    assert len(list(perf_dir.glob("perf_summary_*.json"))) == 1


def test_init_under_launcher_starts_session(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = RankguardConfig(heartbeat=HeartbeatConfig(enabled=True, publish_interval_s=0.05))
    clean_env.setenv(ENV.RUN_DIR, str(tmp_path))
    clean_env.setenv(ENV.LAUNCHER, "1")
    clean_env.setenv(ENV.CONFIG, dumps_config(cfg))
    clean_env.setenv(ENV.RUN_ID, "from-env")
    clean_env.setenv("RANK", "2")
    clean_env.setenv("LOCAL_RANK", "0")
    clean_env.setenv("WORLD_SIZE", "4")
    s = init()
    try:
        assert isinstance(s, Session)
        assert s.identity.rank == 2 and s.identity.world_size == 4
        assert s.config.publish_interval_s == 0.05
        s.step_end(1)
    finally:
        s.close()
    records = _records(tmp_path / heartbeat_file_name(2, os.getpid()))
    assert records[0]["event"] == "process_start"
    assert records[0]["run_id"] == "from-env"
    assert records[-1]["event"] == "process_end"
    assert records[-1]["progress_seq"] == 1


def test_after_the_first_step_end_the_session_calls_the_tracker_directly(
    session: Session,
) -> None:
    session.step_end(1)
    assert session.step_end == session.tracker.step_end  # one Python call per step
    session.step_end(2)
    assert session.tracker.iteration == 2 and session.tracker.progress_seq == 2


def test_zero_code_rank_is_in_train_after_its_first_optimizer_step(session: Session) -> None:
    model, opt = _model_and_optimizer()
    session.install_optimizer_hook()
    assert session.tracker.snapshot()["phase"] == "setup"
    _train_step(model, opt)
    assert session.tracker.snapshot()["phase"] == "train"
    assert session.tracker.phase == "setup"  # derived by readers, not set on the hot path


def test_a_rerun_verdict_is_on_disk_before_the_rank_leaves(tmp_path: Path) -> None:
    """The session hands the rerun machine its publisher: the exit-16 verdict is in the
    heartbeat file when the rank exits, long before the next interval (20 s here); a
    peer that exits first can get this rank killed before ``close()`` writes anything."""
    import math

    from rankguard.rerun import RerunStateMachineConfig
    from rankguard.schema.rerun import RerunOutcome

    s = Session(
        rank_identity(run_id=RUN),
        tmp_path,
        HeartbeatConfig(publish_interval_s=20.0),
        tracker=ProgressTracker(mode="cpu"),
    )
    path = tmp_path / heartbeat_file_name(0, os.getpid())
    on_disk: list[list[dict[str, object]]] = []

    def leave(code: int) -> None:
        on_disk.append([r.get("rerun") for r in _records(path)])
        raise SystemExit(code)

    try:
        rerun = s.rerun(
            RerunStateMachineConfig(rerun_mode="validate_results"),
            state_dir=tmp_path / "state",
            checkpoint=lambda step: None,
            exit=leave,
        )
        batches = rerun.replay(iter(range(10)))
        with pytest.raises(SystemExit):
            for _ in rerun.iteration(1, batches):
                next(batches)
                rerun.validate_loss(torch.tensor(math.nan))
    finally:
        s.close()
    (blocks,) = on_disk
    last = blocks[-1]
    assert isinstance(last, dict), blocks
    assert [e["outcome"] for e in last["events"]] == [RerunOutcome.PERSISTENT.value]  # type: ignore[index]


def test_session_rerun_publishes_its_block(session: Session, tmp_path: Path) -> None:
    from rankguard.rerun import RerunStateMachineConfig
    from rankguard.schema.records import HeartbeatRecord

    rerun = session.rerun(RerunStateMachineConfig(rerun_mode="report_stats"))
    batches = rerun.replay(iter(range(10)))
    for _ in rerun.iteration(1, batches):
        rerun.validate_loss(torch.tensor(float(next(batches))))
    session.close(clean=True, exit_code=0)
    end = _records(tmp_path / heartbeat_file_name(0, os.getpid()))[-1]
    assert end["rerun"]["mode"] == "report_determinism_stats"
    assert HeartbeatRecord.from_dict(end).rerun == end["rerun"]  # valid on ingest
    assert NullSession().rerun().mode == "disabled"  # outside rankguard run: logs only
