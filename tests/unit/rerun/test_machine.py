"""The rerun state machine in one process (no process group): every path of the verdict,
the replayed data and random state, injection, determinism statistics and spiky loss."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from rankguard.rerun import ReproducibleFaultError, RerunStateMachine, RerunStateMachineConfig
from rankguard.rerun.data import RerunDataIterator
from rankguard.rerun.rng import restore_rng, snapshot_rng
from rankguard.rerun.state import IllegalTransition, RerunState, check_transition
from rankguard.schema.layout import rerun_state_file_name
from rankguard.schema.rerun import RerunOutcome
from tests.factories import RerunExit, TorchSaver, raising_exit

pytestmark = pytest.mark.timeout(30)

# A loss function of (iteration, attempt, batch, random draw) -> loss value.
LossFn = Callable[[int, int, int, float], float]


def _machine(tmp_path: Path, **cfg: object) -> tuple[RerunStateMachine, TorchSaver]:
    saver = TorchSaver(tmp_path / "ckpt", lambda: {"w": torch.ones(2)})
    config = RerunStateMachineConfig(rerun_mode="validate_results", **cfg)  # type: ignore[arg-type]
    m = RerunStateMachine(config, checkpoint=saver, state_dir=tmp_path / "ckpt", exit=raising_exit)
    return m, saver


def _train(
    m: RerunStateMachine, loss_fn: LossFn, steps: range, source: int = 0
) -> list[tuple[int, int, int, float]]:
    """A plain loop with the 3-line adoption; returns (step, attempt, batch, draw)."""
    batches = m.replay(iter(range(source, source + 1000)))
    seen = []
    for step in steps:
        for attempt, _ in enumerate(m.iteration(step, batches)):
            batch = next(batches)
            draw = float(torch.rand(()))
            seen.append((step, attempt, batch, draw))
            m.validate_loss(torch.tensor(loss_fn(step, attempt, batch, draw)))
    return seen


def test_config_names_and_validation() -> None:
    assert RerunStateMachineConfig(rerun_mode="report_stats").rerun_mode == (
        "report_determinism_stats"
    )
    cfg = RerunStateMachineConfig()
    assert (cfg.rerun_mode, cfg.check_for_nan_in_loss, cfg.check_for_spiky_loss) == (
        "disabled",
        True,
        False,
    )
    assert cfg.spiky_loss_factor == 10.0 and cfg.spiky_loss_warmup == 100
    for bad, match in (
        ({"rerun_mode": "sometimes"}, "rerun_mode"),
        ({"error_injection_type": "oops"}, "error_injection_type"),
        ({"spiky_loss_factor": 1.0}, "spiky_loss_factor"),
        ({"spiky_loss_factor": math.nan}, "spiky_loss_factor"),
        ({"error_injection_rate": -1}, "error_injection_rate"),
        ({"determinism_stats_interval": 0}, "determinism_stats_interval"),
        ({"on_reproducible": "ignore"}, "on_reproducible"),
    ):
        with pytest.raises(ValueError, match=match):
            RerunStateMachineConfig(**bad)  # type: ignore[arg-type]
    assert RerunStateMachineConfig(error_injection_rate=5).warnings()


def test_transitions_are_explicit() -> None:
    assert check_transition(RerunState.IDLE, RerunState.INITIAL_RUN) is RerunState.INITIAL_RUN
    with pytest.raises(IllegalTransition, match="idle -> rerun_in_place"):
        check_transition(RerunState.IDLE, RerunState.RERUN_IN_PLACE)
    with pytest.raises(IllegalTransition):
        check_transition(RerunState.WILL_RERUN_FROM_CHECKPOINT, RerunState.IDLE)
    with pytest.raises(IllegalTransition):
        check_transition(RerunState.STOPPED, RerunState.IDLE)


def test_validate_result_outside_an_iteration_is_an_error(tmp_path: Path) -> None:
    m, _ = _machine(tmp_path)
    with pytest.raises(RuntimeError, match="outside an iteration"):
        m.validate_loss(torch.tensor(1.0))
    with pytest.raises(TypeError, match="replay"):
        m.should_run_forward_backward(iter([1, 2]))  # type: ignore[arg-type]


def test_transient_fault_reruns_with_the_same_data_and_rng(tmp_path: Path) -> None:
    m, saver = _machine(tmp_path)

    def loss(step: int, attempt: int, batch: int, draw: float) -> float:
        return math.nan if (step, attempt) == (3, 0) else batch + draw

    seen = _train(m, loss, range(1, 6))
    attempts = [s for s in seen if s[0] == 3]
    assert len(attempts) == 2 and attempts[0][2:] == attempts[1][2:]  # batch and draw
    assert [s[2] for s in seen if s[1] == 0] == [0, 1, 2, 3, 4]  # no batch lost or repeated
    assert [(e.outcome, e.iteration, e.action) for e in m.events] == [
        (RerunOutcome.TRANSIENT, 3, "continue")
    ]
    assert m.events[0].initial is not None and math.isnan(m.events[0].initial)
    assert m.reruns == 1 and m.accepted and saver.saved == []
    assert m.state is RerunState.IDLE


def _resume(tmp_path: Path, loss: LossFn, **cfg: object) -> tuple[RerunStateMachine, int]:
    """The resumed job: a new machine over the same state_dir, from the checkpoint."""
    m, saver = _machine(tmp_path, **cfg)
    latest = saver.load_latest()
    assert latest is not None
    first = int(latest["step"]) + 1
    _train(m, loss, range(first, 8), source=first - 1)
    return m, first


def test_persistent_then_different_after_resume_exits_17(tmp_path: Path) -> None:
    m, saver = _machine(tmp_path)

    def first_hardware(step: int, attempt: int, batch: int, draw: float) -> float:
        return math.inf if step == 4 else batch + draw

    with pytest.raises(RerunExit) as exc:
        _train(m, first_hardware, range(1, 8))
    assert exc.value.code == 16
    assert saver.saved == [3] and saver.waits == 1
    assert m.events[-1].outcome is RerunOutcome.PERSISTENT and m.events[-1].action == "exit_16"
    state_file = tmp_path / "ckpt" / rerun_state_file_name(0)
    assert state_file.exists()

    seen_batches: list[int] = []

    def healthy(step: int, attempt: int, batch: int, draw: float) -> float:
        seen_batches.append(batch)
        return batch + draw

    with pytest.raises(RerunExit) as exc:
        _resume(tmp_path, healthy)
    assert exc.value.code == 17
    assert seen_batches == [3]  # the saved batch of iteration 4, replayed
    assert not state_file.exists()


def test_exit_17_event_names_the_first_hardware(tmp_path: Path) -> None:
    m, _ = _machine(tmp_path)
    with pytest.raises(RerunExit):
        _train(m, lambda s, a, b, d: math.nan if s == 2 else 1.0, range(1, 4))
    m2, _ = _machine(tmp_path)
    with pytest.raises(RerunExit):
        _train(m2, lambda s, a, b, d: 1.0, range(2, 4), source=1)
    (event,) = list(m2.events)
    assert event.outcome is RerunOutcome.VALIDATION_FAILED and event.action == "exit_17"
    assert event.faulty_hostname == m.hostname and event.faulty_gpu == "cpu"
    assert event.same_hardware is True  # the test resumes on the same host


def test_same_after_resume_is_a_data_problem_stop(tmp_path: Path) -> None:
    m, _ = _machine(tmp_path)
    bad = lambda s, a, b, d: math.nan if s == 2 else b + d  # noqa: E731
    with pytest.raises(RerunExit):
        _train(m, bad, range(1, 5))
    with pytest.raises(ReproducibleFaultError, match="data or model"):
        _resume(tmp_path, bad)
    assert not (tmp_path / "ckpt" / rerun_state_file_name(0)).exists()


def test_each_verdict_is_published_before_the_barrier_the_ranks_leave_after(
    tmp_path: Path,
) -> None:
    """The first rank out ends the worker group: a rank whose verdict was only in memory
    was killed with it, and node 0 never reported it. So this rank's heartbeat is
    written (``publish``) with the verdict's events, before the barrier, on each path
    that leaves: exit 16, exit 17 and the stop on a reproducible fault."""
    seen: list[tuple[str, list[RerunOutcome]]] = []

    def machine() -> RerunStateMachine:
        saver = TorchSaver(tmp_path / "ckpt", lambda: {"w": torch.ones(2)})
        config = RerunStateMachineConfig(rerun_mode="validate_results")
        m = RerunStateMachine(
            config,
            checkpoint=saver,
            state_dir=tmp_path / "ckpt",
            exit=raising_exit,
            publish=lambda: seen.append(("publish", [e.outcome for e in m.events])),
        )
        barrier = m._agreement.barrier
        m._agreement.barrier = lambda: (seen.append(("barrier", [])), barrier())[1]  # type: ignore[method-assign]
        return m

    bad = lambda s, a, b, d: math.nan if s == 2 else b + d  # noqa: E731
    with pytest.raises(RerunExit) as exc:
        _train(machine(), bad, range(1, 5))
    assert exc.value.code == 16
    assert seen == [("publish", [RerunOutcome.PERSISTENT]), ("barrier", [])]
    seen.clear()
    with pytest.raises(ReproducibleFaultError):
        _train(machine(), bad, range(2, 5), source=1)
    assert seen == [("publish", [RerunOutcome.REPRODUCIBLE]), ("barrier", [])]

    seen.clear()
    with pytest.raises(RerunExit):  # on the first hardware, iteration 6 fails twice
        _train(machine(), lambda s, a, b, d: math.inf if s == 6 else b + d, range(5, 8), 4)
    seen.clear()
    with pytest.raises(RerunExit) as exc:  # elsewhere it passes: that hardware was faulty
        _train(machine(), lambda s, a, b, d: b + d, range(6, 8), source=5)
    assert exc.value.code == 17
    assert seen == [("publish", [RerunOutcome.VALIDATION_FAILED]), ("barrier", [])]


def test_same_after_resume_skip_drops_the_step(tmp_path: Path) -> None:
    m, _ = _machine(tmp_path, on_reproducible="skip")
    bad = lambda s, a, b, d: math.nan if s == 2 else b + d  # noqa: E731
    with pytest.raises(RerunExit):
        _train(m, bad, range(1, 5))
    m2, _ = _machine(tmp_path, on_reproducible="skip")
    batches = m2.replay(iter(range(1, 100)))
    accepted = {}
    for step in range(2, 5):
        for _ in m2.iteration(step, batches):
            m2.validate_loss(torch.tensor(bad(step, 0, next(batches), 0.0)))
        accepted[step] = m2.accepted
    assert accepted == {2: False, 3: True, 4: True}
    assert [e.outcome for e in m2.events] == [RerunOutcome.REPRODUCIBLE]
    assert m2.events[0].action == "skip"


@pytest.mark.parametrize(
    ("kind", "codes", "outcomes"),
    [
        ("transient_error", [], [RerunOutcome.TRANSIENT]),
        ("persistent_error", [16, 17], [RerunOutcome.VALIDATION_FAILED]),
        ("correct_result", [16, "stop"], [RerunOutcome.REPRODUCIBLE]),
    ],
)
def test_error_injection(tmp_path: Path, kind: str, codes: list, outcomes: list) -> None:
    cfg = {"error_injection_rate": 1, "error_injection_type": kind}
    m, _ = _machine(tmp_path, **cfg)
    healthy = lambda s, a, b, d: b + d  # noqa: E731
    got: list[object] = []
    try:
        _train(m, healthy, range(1, 2))
    except RerunExit as exc:
        got.append(exc.code)
        m, _ = _machine(tmp_path, **cfg)
        try:
            _train(m, healthy, range(1, 2))
        except RerunExit as exc2:
            got.append(exc2.code)
        except ReproducibleFaultError:
            got.append("stop")
    assert got == codes
    assert [e.outcome for e in m.events][-1:] == outcomes


def test_injection_leaves_the_training_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(0)
    random.seed(0)
    m, _ = _machine(tmp_path, error_injection_rate=3, error_injection_type="transient_error")
    draws = [s[3] for s in _train(m, lambda s, a, b, d: b + d, range(1, 10)) if s[1] == 0]
    torch.manual_seed(0)
    plain = [float(torch.rand(())) for _ in range(9)]
    assert draws == plain  # a re-run replays its draw; injection draws from its own RNG
    assert any(e.outcome is RerunOutcome.TRANSIENT for e in m.events)


def test_report_determinism_stats(tmp_path: Path) -> None:
    cfg = RerunStateMachineConfig(rerun_mode="report_stats", determinism_stats_interval=2)
    m = RerunStateMachine(cfg, exit=raising_exit)
    noise = iter([0.0, 0.0, 0.01, 0.0, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0])  # per attempt
    seen = _train(m, lambda s, a, b, d: 1.0 + next(noise), range(1, 6))
    assert [s[0] for s in seen] == [1, 2, 2, 3, 4, 4, 5]  # every 2nd iteration twice
    # the largest of the two re-runs' differences: 0.01 / 1.01 and 0.03 / 1.03
    assert m.stats["loss is NaN or Inf"] == pytest.approx(0.03 / 1.03, rel=1e-5)
    assert m.reruns == 2 and not m.events
    block = m.heartbeat_block()
    assert block is not None and block.to_dict()["stats"]


def test_spiky_loss_ignores_warmup(tmp_path: Path) -> None:
    m, _ = _machine(tmp_path, check_for_spiky_loss=True, spiky_loss_warmup=5)
    # a spike inside the warm-up is not flagged; the same spike after it is re-run
    losses = {1: 1.0, 2: 50.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 600.0, 8: 1.0}
    seen = _train(m, lambda s, a, b, d: losses[s], range(1, 9))
    reran = sorted({s for s, attempt, _, _ in seen if attempt == 1})
    assert reran == [7]  # 600 >= 10 x 50; the 50 at step 2 was in the warm-up
    assert not m.events  # not fatal, same result: goes on without a finding
    assert m.accepted and m.state is RerunState.IDLE


def test_disabled_does_nothing(tmp_path: Path) -> None:
    m = RerunStateMachine(RerunStateMachineConfig(), exit=raising_exit)
    batches = m.replay(iter(range(10)))
    seen = _train(m, lambda s, a, b, d: math.nan, range(1, 4))
    assert [s[:3] for s in seen] == [(1, 0, 0), (2, 0, 1), (3, 0, 2)]
    assert m.heartbeat_block() is None and not m.events and m.reruns == 0
    assert batches.batches == []  # nothing recorded for a replay


def test_rng_snapshot_restores_every_generator() -> None:
    gen = torch.Generator().manual_seed(7)
    snap = snapshot_rng([gen])
    first = (
        float(torch.rand(())),
        random.random(),
        float(np.random.rand()),
        float(torch.rand((), generator=gen)),
    )
    restore_rng(snap, [gen])
    again = (
        float(torch.rand(())),
        random.random(),
        float(np.random.rand()),
        float(torch.rand((), generator=gen)),
    )
    assert first == again
    with pytest.raises(ValueError, match="generator"):
        restore_rng(snap, [])


def test_data_iterator_replays_and_realigns_after_a_resume() -> None:
    it = RerunDataIterator(range(10))
    it.advance()
    assert [next(it), next(it)] == [0, 1]
    it.rewind()
    assert [next(it), next(it), next(it)] == [0, 1, 2]  # more than the first time: source
    it.advance()
    assert next(it) == 3
    resumed = RerunDataIterator(range(5, 10))  # the resumed pipeline starts at batch 5
    resumed.load_batches(["saved"])
    assert next(resumed) == "saved"
    resumed.advance()
    assert next(resumed) == 6  # batch 5 was the replayed one: skipped


def test_grad_norm_agreement_reads_the_loops_value(tmp_path: Path) -> None:
    m = RerunStateMachine(
        RerunStateMachineConfig(rerun_mode="validate_results"),
        agreement="grad_norm",
        exit=raising_exit,
    )
    batches = m.replay(iter(range(100)))
    reran = []
    for step in range(1, 5):
        for attempt, _ in enumerate(m.iteration(step, batches)):
            next(batches)
            value = torch.tensor(math.nan if (step, attempt) == (2, 0) else 1.0)
            loss = m.validate_loss(value)
            assert math.isnan(float(loss)) is ((step, attempt) == (2, 0))  # poisoned locally
            m.agree_on(float(loss))  # a float the loop already read: no device read
            reran.append((step, attempt))
    assert [s for s, a in reran if a == 1] == [2]
    with pytest.raises(ValueError, match="agreement"):
        RerunStateMachine(agreement="sometimes")


def test_an_abandoned_iteration_leaves_the_machine_ready(tmp_path: Path) -> None:
    m, _ = _machine(tmp_path)
    batches = m.replay(iter(range(100)))
    with pytest.raises(ZeroDivisionError):
        for _ in m.iteration(1, batches):
            next(batches)
            raise ZeroDivisionError  # the body failed: the caller handles it
    assert m.state is RerunState.IDLE
    seen = _train(m, lambda s, a, b, d: 1.0, range(2, 4))
    assert [(s, a) for s, a, _, _ in seen] == [(2, 0), (3, 0)]


@pytest.mark.parametrize("given", [True, False])
def test_exit_16_says_whether_it_saved(tmp_path: Path, given: bool) -> None:
    """Without a checkpoint and a state_dir the machine exits 16 with nothing saved: its
    finding said "checkpoint and exit 16" all the same."""
    saver = TorchSaver(tmp_path / "ckpt", lambda: {"w": torch.ones(2)})
    config = RerunStateMachineConfig(rerun_mode="validate_results")
    kw: dict[str, object] = {"checkpoint": saver, "state_dir": tmp_path / "ckpt"} if given else {}
    m = RerunStateMachine(config, exit=raising_exit, **kw)  # type: ignore[arg-type]

    def fails_at_4(step: int, attempt: int, batch: int, draw: float) -> float:
        return math.inf if step == 4 else batch + draw

    with pytest.raises(RerunExit) as exc:
        _train(m, fails_at_4, range(1, 8))
    assert exc.value.code == 16
    message = m.events[-1].message
    assert m.events[-1].action == "exit_16"
    if given:
        assert saver.saved == [3]
        assert message.endswith("checkpoint and exit 16 to re-run it after a resume")
    else:
        assert saver.saved == []
        assert "exit 16 WITHOUT a checkpoint" in message and "checkpoint and exit" not in message
