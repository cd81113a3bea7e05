"""Preemption: config, the flag-only handler, the DataLoader helper, the grace budget,
the launcher-side coordinator and the exit code."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rankguard.config import ConfigError, load_config
from rankguard.launcher.exitcodes import EXIT_PREEMPTED, RETRYABLE, JobOutcome, exit_code
from rankguard.monitor.config import HeartbeatConfig
from rankguard.preempt import ExitSignalHandler, PreemptionConfig, TorchFileSaver, parse_exit_signal
from rankguard.preempt.budget import GraceBudget, load_save_time, store_save_time
from rankguard.preempt.coordinator import PreemptionCoordinator
from rankguard.schema.cadence import Cadence
from rankguard.schema.layout import CONTROL_FILE, StoreKeys
from rankguard.slurm.retry import Decision, decide

pytestmark = pytest.mark.timeout(30)


# ---- config ---------------------------------------------------------------------------


def test_megatron_bridge_names() -> None:
    cfg = load_config(
        None,
        [
            "preemption.preempt_time=90",
            "preemption.exit_signal_handler=true",
            "preemption.exit_signal=SIGUSR1",
            "preemption.exit_signal_handler_for_dataloader=true",
        ],
    ).preemption
    assert cfg.enable_exit_handler and cfg.enable_exit_handler_for_data_loader
    assert cfg.signum is signal.SIGUSR1 and cfg.preempt_time == 90
    plugin = PreemptionConfig(
        preempt_time=60, enable_exit_handler=True, enable_exit_handler_for_data_loader=False
    )
    assert plugin.signum is signal.SIGTERM


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("preemption.preempt_time=0", "preempt_time"),
        ("preemption.preempt_time=.nan", "preempt_time"),
        ("preemption.exit_signal=SIGKILL", "exit_signal"),
        ("preemption.exit_signal=9", "exit_signal"),
        ("preemption.nope=1", "preemption.nope"),
        ("fault_tolerance.actions.job_preempted=restart", "only report"),
    ],
)
def test_bad_values_name_the_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_contradicting_aliases_are_an_error() -> None:
    with pytest.raises(ValueError, match="contradicts"):
        PreemptionConfig(enable_exit_handler=True, exit_signal_handler=False)


def test_signal_names() -> None:
    assert parse_exit_signal("term") is signal.SIGTERM
    assert parse_exit_signal("USR2") is signal.SIGUSR2
    assert parse_exit_signal(int(signal.SIGUSR1)) is signal.SIGUSR1


def test_warnings_when_preemption_cannot_work() -> None:
    cfg = load_config(None, ["preemption.enable_exit_handler=true"])
    assert any("preemption.enable_exit_handler=true but heartbeat" in w for w in cfg.warnings())
    cfg = load_config(None, ["preemption.enable_exit_handler_for_data_loader=true"])
    assert any("NO effect" in w and "data_loader" in w for w in cfg.warnings())


# ---- handler --------------------------------------------------------------------------


def test_handler_sets_a_flag_and_restores_the_previous_one() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        calls: list[int] = []
        h = ExitSignalHandler(signal.SIGUSR1, on_signal=calls.append)
        assert h.install()
        h.listening = True
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert h.received and h.count == 2 and calls == [signal.SIGUSR1] * 2
        assert seen == []  # the previous handler did not run
        h.release()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_not_listening_falls_through_to_the_previous_handler() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        h = ExitSignalHandler(signal.SIGUSR2)
        h.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)
        assert seen == [signal.SIGUSR2] and not h.received
        h.release()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_installed_on_the_main_thread_only() -> None:
    h = ExitSignalHandler(signal.SIGUSR1)
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(h.install()))
    t.start()
    t.join()
    assert out == [False] and not h.installed


def test_release_leaves_a_handler_installed_since() -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        h = ExitSignalHandler(signal.SIGUSR1)
        h.install()

        def theirs(s: int, f: Any) -> None:
            pass

        signal.signal(signal.SIGUSR1, theirs)
        h.release()
        assert signal.getsignal(signal.SIGUSR1) is theirs
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---- DataLoader workers ---------------------------------------------------------------


class _Slow:
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        time.sleep(0.05)
        return i


def _iterate_while_signalled(worker_init_fn: Any) -> list[int]:
    import torch.utils.data as tud

    loader = tud.DataLoader(
        _Slow(),
        batch_size=2,
        num_workers=2,
        worker_init_fn=worker_init_fn,
        multiprocessing_context="fork",
    )
    it = iter(loader)
    got = [int(x) for x in next(it)]
    time.sleep(0.3)  # the workers have run worker_init_fn
    for w in it._workers:  # type: ignore[attr-defined]
        os.kill(w.pid, signal.SIGTERM)
    for batch in it:
        got += [int(x) for x in batch]
    return got


def test_dataloader_workers_ignore_the_exit_signal() -> None:
    from rankguard.preempt import ignore_exit_signal

    assert sorted(_iterate_while_signalled(ignore_exit_signal)) == list(range(16))


def test_without_the_helper_a_signalled_worker_breaks_the_loop() -> None:
    # forked workers inherit the parent's handler: the default one here, whatever an
    # earlier test of this process left installed
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        # "DataLoader worker (pid N) is killed by signal", or the pipe of a worker
        # killed while sending a batch (a reset, or EOF while a batch's shared memory
        # was being handed over): either way the loop breaks
        with pytest.raises((RuntimeError, ConnectionError, EOFError)) as exc:
            _iterate_while_signalled(None)
        assert isinstance(exc.value, (ConnectionError, EOFError)) or "DataLoader worker" in str(
            exc.value
        )
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---- saver, budget ----------------------------------------------------------------------


def test_file_saver_is_atomic_and_loads_the_newest(tmp_path: Path) -> None:
    state = {"w": 1}
    saver = TorchFileSaver(tmp_path, 3, lambda: dict(state))
    assert saver.load_latest() is None
    saver.save(5)
    state["w"] = 2
    saver.save(7)
    (saver.directory / ".step_9.pt.123.tmp").write_bytes(b"torn")
    assert saver.steps() == [5, 7]
    assert saver.load_latest() == (7, {"w": 2})


def test_grace_budget(tmp_path: Path) -> None:
    cadence = Cadence.of(HeartbeatConfig(publish_interval_s=5.0, scan_interval_s=1.0))
    assert cadence.agreement_lead_s(relayed=False) == 4.0
    lead = cadence.agreement_lead_s(relayed=True)
    assert lead == 13.0 + 7.0
    budget = GraceBudget(60.0, lead, save_s=None)
    assert budget.fits() and budget.block().save_s is None
    budget.observe(20.0)
    assert budget.fits()
    budget.observe(float("nan"))
    budget.observe(50.0)
    assert not budget.fits() and "70.0s > preempt_time=60s" in budget.warning()
    path = tmp_path / "ft" / "preempt_state.json"
    store_save_time(path, budget)
    assert load_save_time(path) == 50.0
    again = GraceBudget(60.0, lead, load_save_time(path))
    assert not again.fits() and again.block().save_source == "previous run"
    path.write_text("{bad")
    assert load_save_time(path) is None


# ---- coordinator ------------------------------------------------------------------------


class _Store:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)


class _Workers:
    def __init__(self, pids: list[int]) -> None:
        self._pids = pids

    def pids(self) -> dict[int, int | None]:
        return dict.fromkeys(self._pids)

    def owns(self, pid: int) -> bool:
        return pid in self._pids


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _coordinator(node: int, store: _Store, tmp_path: Path, **kw: Any) -> PreemptionCoordinator:
    return PreemptionCoordinator(
        PreemptionConfig(enable_exit_handler=True, preempt_time=30),
        node_rank=node,
        nnodes=2,
        run_id="r",
        run_dir=tmp_path / f"n{node}",
        workers=_Workers([]),  # type: ignore[arg-type]
        store=store,
        say=lambda m: None,
        **kw,
    )


def test_node_one_signal_preempts_the_whole_job(tmp_path: Path) -> None:
    store = _Store()
    clock = _Clock()
    stops: list[tuple[str, float | None]] = []

    def request_stop(reason: str, lead_s: float | None) -> int:
        stops.append((reason, lead_s))
        return 42

    node0 = _coordinator(0, store, tmp_path, request_stop=request_stop, clock=clock)
    node1 = _coordinator(1, store, tmp_path, clock=clock)
    (tmp_path / "n1").mkdir()
    assert not node1.claims(signal.SIGINT)  # not the exit signal: not ours
    assert node1.claims(signal.SIGTERM)
    node1.tick()
    assert node1.active and store.check([StoreKeys("r").preempt_request(1)])
    node0.tick()
    assert node0.active and node0.stop_at is None  # no fresh progress yet: it waits
    clock.t += 7.0  # wait_fresh_s: the default lead then
    node0.tick()
    assert node0.stop_at == 42 and len(stops) == 1 and stops[0][1] is None
    node1.tick()
    assert node1.stop_at == 42
    control = json.loads((tmp_path / "n1" / CONTROL_FILE).read_text())
    assert control["stop_at_step"] == 42 and control["reason"].startswith("preempted")
    node0.tick()
    assert len(stops) == 1  # decided once
    assert node0.time_left() == 23 and not node0.expired()
    clock.t += 23
    assert node0.expired()


def test_a_second_signal_changes_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    coord = PreemptionCoordinator(
        PreemptionConfig(enable_exit_handler=True),
        node_rank=0,
        nnodes=1,
        run_id="r",
        run_dir=tmp_path,
        workers=_Workers([]),  # type: ignore[arg-type]
        request_stop=lambda r, lead: 7,
        ranks=lambda: {0: _state(True), 1: _state(True)},
        fresh_lead_s=3.0,
        say=said.append,
    )
    coord.claims(signal.SIGTERM)
    coord.tick()
    started = coord.started_at
    coord.claims(signal.SIGTERM)
    coord.tick()
    assert coord.started_at == started and coord.stop_at == 7
    assert any("again: ignored" in m for m in said)


def _state(signalled: bool) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        record=SimpleNamespace(extra={"preempt": {"signal_received": signalled}})
    )


def test_fresh_progress_gives_the_short_lead(tmp_path: Path) -> None:
    leads: list[float | None] = []
    states = {0: _state(True), 1: _state(False)}
    coord = PreemptionCoordinator(
        PreemptionConfig(enable_exit_handler=True),
        node_rank=0,
        nnodes=1,
        run_id="r",
        run_dir=tmp_path,
        workers=_Workers([]),  # type: ignore[arg-type]
        request_stop=lambda r, lead: leads.append(lead) or 9,
        ranks=lambda: states,
        fresh_lead_s=2.5,
        say=lambda m: None,
    )
    coord.claims(signal.SIGTERM)
    coord.tick()
    assert coord.stop_at is None  # rank 1 has not reported since the signal
    states[1] = _state(True)
    coord.tick()
    assert coord.stop_at == 9 and leads == [2.5]


# ---- exit codes and retries -------------------------------------------------------------


def test_preempted_exit_code_wins_and_is_requeued() -> None:
    assert exit_code(JobOutcome(preempted=True)) == EXIT_PREEMPTED == 14
    assert exit_code(JobOutcome(preempted=True, failed=True, signal=15)) == EXIT_PREEMPTED
    assert exit_code(JobOutcome(signal=15)) == 143
    assert EXIT_PREEMPTED in RETRYABLE
    # a preemption spends no retry of the failure budget
    assert decide(EXIT_PREEMPTED, 5, 0) is Decision.REQUEUE


# ---- the in-loop API ------------------------------------------------------------------


def _session(tmp_path: Path, launcher_pid: int | None = None) -> Any:
    from rankguard.monitor.config import HeartbeatConfig
    from rankguard.preempt.rank import RankPreemption
    from rankguard.rank.identity import RankIdentity
    from rankguard.rank.timeline import ProgressTracker
    from rankguard.session import Session

    tracker = ProgressTracker()
    pre = RankPreemption(
        PreemptionConfig(enable_exit_handler=True, exit_signal="SIGUSR1"),
        tracker,
        launcher_pid=launcher_pid,
    )
    assert pre.install()
    return Session(
        RankIdentity.from_env({}),
        tmp_path,
        HeartbeatConfig(),
        tracker=tracker,
        publish=False,
        preemption=pre,
        dataloader_ignores_signal=True,
    )


def test_should_stop_is_quiet_until_the_signal_then_stops_at_the_agreed_step(
    tmp_path: Path,
) -> None:
    from rankguard.monitor.agree import ControlReader, write_control

    previous = signal.getsignal(signal.SIGUSR1)
    session = _session(tmp_path)
    try:
        assert session.worker_init_fn is not None
        assert not session.should_stop() and session._quiet  # listening, nothing to do
        assert session.preemption.handler.listening
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert session.preempted and not session._quiet
        session._control = ControlReader(tmp_path)  # what the heartbeat thread polls
        write_control(tmp_path, 3, "preempted: test")
        session.preemption._last_poll = 0.0
        for _ in range(2):
            session.step_end()
        assert not session.should_stop()  # step 2 < 3 (the step was read meanwhile)
        session.step_end()
        assert session.should_stop() and session.stop_reason == "preempted: test"
        with pytest.raises(SystemExit) as exc:
            session.exit_preempted()
        assert exc.value.code == 0
    finally:
        session.close()
        signal.signal(signal.SIGUSR1, previous)
    assert signal.getsignal(signal.SIGUSR1) == previous  # released with the session


def test_a_rank_signalled_alone_tells_its_launcher(tmp_path: Path) -> None:
    from rankguard.preempt import rank as rank_mod

    told: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: told.append(s))
    session = _session(tmp_path, launcher_pid=os.getpid())
    session.preemption.cfg.exit_signal = "SIGUSR2"  # the launcher gets the same signal
    try:
        session.should_stop()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        session.should_stop()
        assert told == []  # within a second a stop step may still come from the launcher
        session.preemption._first_seen -= rank_mod.TELL_LAUNCHER_AFTER_S
        session.should_stop()
        time.sleep(0.01)
        assert told == [signal.SIGUSR2] and session.preemption.launcher_told
    finally:
        session.close()
        signal.signal(signal.SIGUSR2, previous)


# ---- rankguard status ---------------------------------------------------------------------


def test_status_shows_the_budget_and_the_saved_step() -> None:
    from rankguard.cli.status_render import render_status

    status: dict[str, Any] = {
        "state": "completed",
        "ranks": [],
        "preemption": {
            "budget": GraceBudget(60.0, 13.0, 55.0).block().to_dict(),
            "signal": "SIGTERM",
            "reason": "preempted: node 0's launcher received SIGTERM",
            "stop_at_step": 42,
            "saved_step": 42,
            "ranks_saved": 8,
            "terminated_pids": [],
        },
    }
    text = render_status(status, [])
    assert "Preemption: grace 60.0 s, longest save 55.0 s (previous run)" in text
    assert "a save does NOT fit the grace window" in text
    assert "stop after 42 training step(s) of this run, saved script step 42 (8 rank(s))" in text
    status["preemption"] = {"budget": GraceBudget(60.0, 4.0, 5.0).block().to_dict()}
    assert "NOT fit" not in render_status(status, [])


def test_preemption_on_but_never_asked_is_said_once_after_the_first_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A config turns preemption on, the script never calls should_stop(): the signal
    would end the ranks without a save. Said once, from the heartbeat thread's block."""
    from rankguard.preempt.rank import RankPreemption
    from rankguard.rank.timeline import ProgressTracker

    previous = signal.getsignal(signal.SIGUSR1)
    for asks in (False, True):
        tracker = ProgressTracker()
        pre = RankPreemption(
            PreemptionConfig(enable_exit_handler=True, exit_signal="SIGUSR1"), tracker
        )
        assert pre.install()
        try:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="rankguard.preempt.rank"):
                pre.heartbeat_block()  # before any step: nothing yet
                tracker.step_end()
                if asks:
                    pre.handler.listening = True  # what should_stop() sets
                tracker.step_end()
                for _ in range(3):
                    pre.heartbeat_block()
            said = [r.getMessage() for r in caplog.records]
            if asks:
                assert said == []
            else:
                (line,) = said
                assert "preemption on (preemption.enable_exit_handler, SIGUSR1), but the " in line
                assert "script saves nothing" in line and "ends the ranks" in line
        finally:
            pre.release()
    assert signal.getsignal(signal.SIGUSR1) == previous
    # another rank than 0 says nothing (rank 0's line is the job's)
    tracker = ProgressTracker()
    other = RankPreemption(
        PreemptionConfig(enable_exit_handler=True, exit_signal="SIGUSR1"), tracker, rank=1
    )
    assert other.install()
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rankguard.preempt.rank"):
            for _ in range(3):
                tracker.step_end()
                other.heartbeat_block()
        assert [r.getMessage() for r in caplog.records] == []
    finally:
        other.release()


@pytest.mark.parametrize("clean", [True, False])
def test_the_preemption_line_says_what_was_saved(clean: bool) -> None:
    """'requeue the job, it resumes from the last save' was said whatever happened: a
    script that saves nothing had its ranks killed by the signal and saved no step; a
    clean exit at the stop step is no save either (the saves: test_preempt_saved.py)."""
    from types import SimpleNamespace

    from rankguard.preempt.coordinator import PreemptionEvaluator
    from tests.factories import heartbeat_record, heartbeat_rules

    coordinator = SimpleNamespace(
        active=True,
        stop_at=1,
        reason="preempted",
        sig=15,
        cfg=SimpleNamespace(preempt_time=30.0),
        summary=lambda: {},
    )
    ev = PreemptionEvaluator(coordinator, GraceBudget(30.0, 1.0), "run")  # type: ignore[arg-type]
    rules = heartbeat_rules(2)
    # a clean end at the stop step: the rank left at the request (should_stop said stop)
    exit_info = {"clean": True, "stopped_at": 1} if clean else {"clean": False, "exit_code": -15}
    for rank in (0, 1):
        raw = heartbeat_record(rank, event="process_end", exit=exit_info, world_size=2)
        rules.ingest(raw, 1.0)
    rules.evaluate(1.0)
    ev.evaluate(1.0, rules.ranks)
    line = ev.saved_line()
    assert line.startswith(
        "stopped after 1 training step(s) of this run without a checkpoint of it (0 of 2 rank(s)"
    )
    assert "the next run starts from the last checkpoint the script wrote, if any" in line
