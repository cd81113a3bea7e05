"""End to end: live recovery with ``--preload torch`` under the real ``rankguard run``
(2 CPU ranks on gloo, the demo model in DDP): the ranks and the standby are forked from
the fork server, rank 1 is SIGKILLed (the standby takes it, a new standby is forked into
its slot and said ready), then rank 0 (the refilled standby takes it): no group restart,
and nothing of the job left behind.

Why a real launch: only torch elastic's ``MultiprocessContext`` started by the agent,
the fork server and the ranks' in-process rounds together show that a forked standby
takes a rank and that the refill forked later is a worker of the same context (its
standby's wait reached, its end at the job's end). The view of the forked workers alone
is tested on a real context in ``tests/unit/launcher/test_live_forked.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import no_leftover_workers, read_jsonl, run_rankguard, standalone_run
from .test_live_recovery_e2e import LIVE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

_READY = re.compile(r"live recovery: new standby pid (\d+) ready \(([\d.]+) s after its start\)")


def test_forked_standbys_take_two_lost_ranks_without_a_group_restart(
    tmp_path: Path, run_id: str
) -> None:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=2),
            "--preload",
            "torch",
            "--standby-ranks",
            "1",
            "--max-restarts",
            "1",
            *LIVE,
            "-m",
            "rankguard.demo.train",
            *("--log-every", "1", "--step-sleep", "0.05", "--steps", "30"),
            *("--kill-at", "1:5", "--kill-at", "0:25"),
        ],
        timeout=280,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    run_dir = tmp_path / "heartbeat" / run_id
    lines = read_jsonl(run_dir / "restarts.jsonl")
    assert [line["kind"] for line in lines] == ["live_recovery", "live_recovery"], lines
    first, second = lines
    assert (first["lost_rank"], first["exit"]) == (1, "SIGKILL")
    assert (second["lost_rank"], second["exit"]) == (0, "SIGKILL")
    for live in lines:
        assert live["resumed_t"] is not None and live["resumed_t"] > live["fault_t"]
    # the standby forked into rank 1's slot was at its wait before rank 0 was lost,
    # and it took rank 0
    ready = {int(pid): float(s) for pid, s in _READY.findall(out)}
    assert second["standby_pid"] in ready, out[-4000:]
    assert (
        f"live recovery: new standby pid {second['standby_pid']} started in place of rank "
        "1's lost process"
    ) in out
    assert "the worker group restarts" not in out
    assert no_leftover_workers(run_id)
