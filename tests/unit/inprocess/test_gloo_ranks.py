"""Ranks as processes on gloo, a TCPStore(port=0) on 127.0.0.1: faults injected into a
real training script (tests/e2e/scripts/inprocess_train.py), its results compared with
the same training without faults."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.ranks

SCRIPT = Path(__file__).parents[2] / "e2e" / "scripts" / "inprocess_train.py"
ROOT = Path(__file__).parents[3]
STEPS = 20
WORLD = 2


def run_ranks(
    out: Path, *args: str, steps: int = STEPS, timeout: float = 90.0
) -> tuple[list[int], list[dict[str, Any]]]:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        WORLD_SIZE=str(WORLD),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        TORCH_CPP_LOG_LEVEL="error",
    )
    env.pop("RANKGUARD_LAUNCHER", None)
    # each rank's stderr to a file (a pipe nobody reads could fill and block the rank)
    errs = [(out / f"rank_{r}.stderr").open("w") for r in range(WORLD)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), "--out", str(out), "--steps", str(steps), *args],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=errs[r],
            text=True,
        )
        for r in range(WORLD)
    ]
    for err in errs:
        err.close()
    try:
        rcs = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r in range(WORLD):
        path = out / f"rank_{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    return rcs, results


def stderr_tails(out: Path) -> str:
    """The end of each rank's stderr, for an assertion's message."""
    return "\n".join(
        f"--- rank {r}\n{(out / f'rank_{r}.stderr').read_text()[-3000:]}" for r in range(WORLD)
    )


def reference_weights(steps: int = STEPS) -> list[float]:
    """The script's training without faults, computed here."""
    dim = 8
    target = torch.arange(dim, dtype=torch.float32) / dim
    w = torch.zeros(dim)
    for s in range(steps):
        grad = torch.zeros(dim)
        for rank in range(WORLD):
            x = torch.linspace(-1, 1, dim) * (1 + (rank + s) % 3)
            err = float((w - target) @ x)
            grad += 2 * err * x
        w = w - 0.01 * grad / WORLD
    return w.tolist()


def assert_completed(results: list[dict[str, Any]], restarts: int, steps: int = STEPS) -> None:
    ref = reference_weights(steps)
    for res in results:
        assert res["error"] is None
        assert res["restarts"] == restarts
        assert sorted(map(int, res["losses"])) == list(range(steps))  # every step, once
        assert res["final_w"] == pytest.approx(ref, abs=1e-5)  # the loss continued


def test_exception_in_one_rank_every_rank_reenters_and_completes(tmp_path: Path) -> None:
    rcs, results = run_ranks(tmp_path, "--faults", "0:1:5:raise")
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=1)
    for res in results:
        assert res["rounds"][1]["cause"] == "exception" and res["rounds"][1]["culprit"] == 1
    # fault -> first step of the new round, on the rank that raised
    took = results[1]["first_step_after"][0] - results[1]["fault_time"][0]
    assert 0 < took < 5.0


def test_hang_before_a_collective_soft_timeout_then_reentry(tmp_path: Path) -> None:
    rcs, results = run_ranks(tmp_path, "--faults", "0:0:4:hang", "--soft", "2", "--hard", "20")
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=1)
    for res in results:  # rank 0 sleeping outside the collective is the culprit
        assert res["rounds"][1]["cause"] == "soft_timeout" and res["rounds"][1]["culprit"] == 0
        message = res["rounds"][1]["message"]
        # the soft timeout (2 s) fired only once the main thread had run no Python for
        # longer: the culprit's own measure, "main thread stuck 2.1s > soft_timeout 2s"
        own = re.search(r"stuck (\d+\.\d)s > soft_timeout 2s", message)
        if own is not None:
            assert float(own.group(1)) >= 2.0, res["rounds"][1]
            continue
        # Or rank 1, idle in the all-reduce as long, fired first (rank 0's watcher thread
        # waited for a core): rank 0 was interrupted while stuck outside the collective
        # for at least half the soft timeout, which makes it the culprit, and says so.
        peer = re.search(
            r"^(rank 1 failed in round 0|a peer failed); this rank's main thread had run "
            r"no Python for (\d+\.\d)s at inprocess_train\.py:\d+ in ",
            message,
        )
        assert peer is not None and float(peer.group(2)) >= 1.0, res["rounds"][1]
    # From the fault: the stuck time counts from the main thread's last liveness stamp,
    # which the watcher asks for every 0.1 s (later when its thread waits for a core), so
    # that stamp can precede the fault (a CI run measured 1.988 s here against 2.0)
    took = results[0]["first_step_after"][0] - results[0]["fault_time"][0]
    assert 1.5 <= took < 10.0


def test_faults_past_the_budget_end_the_processes(tmp_path: Path) -> None:
    faults = "0:1:3:raise,1:0:5:raise,2:1:7:raise"
    rcs, results = run_ranks(tmp_path, "--faults", faults, "--per-window", "2")
    assert all(rc != 0 for rc in rcs)  # the launcher's process restart takes over
    for res in results:
        assert res["restarts"] == 2
        assert "budget spent" in res["error"] or "abandoned" in res["error"]
    assert any("max_restarts_per_window=2" in res["error"] for res in results)


def test_a_dead_peer_cannot_reenter_the_others_give_up(tmp_path: Path) -> None:
    rcs, results = run_ranks(tmp_path, "--faults", "0:1:5:exit", "--soft", "2", "--hard", "20")
    assert rcs[1] == 3
    assert rcs[0] != 0
    assert "cannot re-enter" in results[0]["error"] and "[1]" in results[0]["error"]


def test_a_late_starting_rank_is_waited_for_not_declared_lost(tmp_path: Path) -> None:
    # rank 1 reaches the first barrier 4 s late, past heartbeat_timeout (3 s)
    rcs, results = run_ranks(tmp_path, "--late", "4", "--faults", "0:1:5:raise")
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=1)


def test_hard_timeout_ends_the_stuck_process(tmp_path: Path) -> None:
    rcs, results = run_ranks(
        tmp_path, "--faults", "0:1:5:hang_blocked", "--soft", "1.5", "--hard", "3"
    )
    assert rcs[1] == 124  # HARD_TIMEOUT_EXIT_CODE
    assert rcs[0] != 0 and results[0]["error"]


def test_twenty_reentries_leave_no_thread_fd_or_memory_growing(tmp_path: Path) -> None:
    faults = ",".join(f"{r}:{r % 2}:{r + 2}:raise" for r in range(20))
    rcs, results = run_ranks(tmp_path, "--faults", faults, steps=26, timeout=150)
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=20, steps=26)
    for res in results:
        rounds = res["rounds"]
        assert len(rounds) == 21
        assert {r["threads"] for r in rounds[1:]} == {rounds[1]["threads"]}
        assert {r["fds"] for r in rounds[1:]} == {rounds[1]["fds"]}
        growth_kb = rounds[-1]["rss_kb"] - rounds[2]["rss_kb"]
        assert growth_kb < 8 * 1024, f"RSS grew {growth_kb} kB over 18 re-entries"


def test_random_faults(tmp_path: Path) -> None:
    rcs, results = run_ranks(
        tmp_path, "--random", "4", "--seed", "7", "--soft", "4", "--hard", "20", timeout=120
    )
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=4)
