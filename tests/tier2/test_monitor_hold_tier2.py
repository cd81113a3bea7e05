"""Ranks as threads: the monitor shares the ranks' process, so whatever stops that
process stops the monitor too. A C call that keeps the interpreter lock for 1.5 s in one
rank's thread (an extension that does not release it) stops every thread for that long:
the monitor and both ranks' heartbeat threads, against a process timeout of 1 s. The
monitor counts the time it could not watch out of the ranks' silence: no finding, and the
hold is in the status."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from tests.harness import RankContext, ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]

HOLD_US = 1_500_000
STEPS = 10


def test_the_interpreter_held_by_a_rank_is_nobodys_silence(tmp_path: Path) -> None:
    keep_the_lock = ctypes.PyDLL(None).usleep  # PyDLL: the lock is kept during the call

    def hold_at_step_5(ctx: RankContext, step: int) -> None:
        if step == 5 and ctx.rank == 0:
            keep_the_lock(HOLD_US)

    def rank(ctx: RankContext) -> int:
        return ctx.train(STEPS, step_s=0.01, on_step=hold_at_step_5)

    res = ThreadedJob(tmp_path / "logs", 2).run(rank)
    assert res.values() == [STEPS, STEPS]
    res.assert_healthy({"train"})
    assert res.status is not None
    monitor = res.status["monitor"]
    assert monitor["holds"] >= 1
    assert monitor["held_s"] >= 1.3
