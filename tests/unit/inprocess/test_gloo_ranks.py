"""Ranks as processes on gloo, a TCPStore(port=0) on 127.0.0.1: faults injected into a
real training script (tests/e2e/scripts/inprocess_train.py), its results compared with
the same training without faults. Each rank is a process of its own (the in-process
restart's interrupts are signals to a process, its hard timeout ends one), forked from
the rank tests' forkserver rather than a fresh interpreter."""

from __future__ import annotations

import json
import os
import re
import sys
import time
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


def _rank_process(argv: list[str], env: dict[str, str], err: str) -> None:
    """One rank: the training script run as ``__main__`` with the rank's environment and
    command line, its standard output discarded and its standard error to ``err`` (the
    process exits with the script's code: ``os._exit``'s, ``SystemExit``'s, 1 for an
    exception)."""
    import runpy

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, os.devnull), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def run_ranks(
    out: Path, *args: str, steps: int = STEPS, timeout: float = 90.0
) -> tuple[list[int], list[dict[str, Any]]]:
    """The script on ``WORLD`` ranks, each its own process, forked from
    ``tests.factories.rank_context()``'s forkserver (a fresh interpreter with torch
    imported once, no threads: what earlier tests left in this process cannot reach the
    ranks, and no rank pays for an interpreter and torch's import); their exit codes and
    the results each wrote."""
    import torch.distributed as dist

    from tests.factories import rank_context

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
    argv = [str(SCRIPT), "--out", str(out), "--steps", str(steps), *args]
    ctx = rank_context()
    procs = [
        ctx.Process(
            target=_rank_process,
            args=(
                argv,
                {**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                str(out / f"rank_{r}.stderr"),
            ),
        )
        for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        if any(proc.exitcode is None for proc in procs):
            raise TimeoutError(f"ranks not done after {timeout} s:\n{stderr_tails(out)}")
        rcs = [int(proc.exitcode) for proc in procs]  # type: ignore[arg-type]
    finally:
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join(10)
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


def test_a_stopped_peer_is_alive_and_waited_for_not_given_up(tmp_path: Path) -> None:
    """Rank 0's whole process stopped (SIGSTOP, as a rank starved of CPU: its heartbeat
    thread stands still too) for 6 s, twice heartbeat_timeout, while rank 1 raised and
    waits at the barrier: its process is alive, so rank 1 waits; both re-enter."""
    rcs, results = run_ranks(
        tmp_path, "--faults", "0:0:5:stop,0:1:5:raise", "--soft", "2", "--hard", "20"
    )
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=1)


def test_a_peer_stopped_in_the_group_set_up_after_the_barrier_is_waited_for(
    tmp_path: Path,
) -> None:
    """Rank 1 raised, both passed round 1's barrier, then rank 1's process stopped for
    6 s as it began the process group's store rendezvous: rank 0's set-up timed out
    (2.7 s) waiting for it. That is a failed round, not the end of rank 0: it joins
    round 2 and waits there for its live peer; both train to the end."""
    rcs, results = run_ranks(
        tmp_path, "--faults", "0:1:5:stop_setup", "--soft", "2", "--hard", "20"
    )
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=1)  # fn ran twice: round 1 never reached it
    for res in results:
        again = res["rounds"][1]
        # round 2 as a rule; on a loaded machine (4 test workers on 2 cores) the group
        # of round 2 once failed to form in its time too, and round 3 trained: each
        # round before the one that trained failed in its set-up, none ended a rank
        assert again["round"] >= 2, again
        assert again["cause"] == "collective_error", again
        before = again["round"] - 1
        assert f"could not form the process group of round {before}" in again["message"], again


def test_hard_timeout_ends_the_stuck_process(tmp_path: Path) -> None:
    rcs, results = run_ranks(
        tmp_path, "--faults", "0:1:5:hang_blocked", "--soft", "1.5", "--hard", "3"
    )
    assert rcs[1] == 124  # HARD_TIMEOUT_EXIT_CODE
    assert rcs[0] != 0 and results[0]["error"]


def test_exceptions_reenter_twenty_times_after_a_late_start_leaving_nothing_growing(
    tmp_path: Path,
) -> None:
    """One pair of ranks for three behaviours: rank 1 reaches the first barrier 4 s late,
    past heartbeat_timeout (3 s), and is waited for, not declared lost; an exception in
    one rank (rank 0 in round 0, then ranks 1 and 0 in turn) makes every rank re-enter,
    the raising rank named as the culprit, and the training completes with the loss of a
    run without faults; twenty re-entries leave no thread, file descriptor or memory
    growing."""
    faults = ",".join(f"{r}:{r % 2}:{r + 2}:raise" for r in range(20))
    rcs, results = run_ranks(tmp_path, "--late", "4", "--faults", faults, steps=26, timeout=150)
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=20, steps=26)
    for res in results:
        rounds = res["rounds"]
        assert len(rounds) == 21
        for k in range(1, 21):  # round k follows the exception of round k - 1
            assert rounds[k]["cause"] == "exception", rounds[k]
            assert rounds[k]["culprit"] == (k - 1) % 2, rounds[k]
        assert {r["threads"] for r in rounds[1:]} == {rounds[1]["threads"]}
        assert {r["fds"] for r in rounds[1:]} == {rounds[1]["fds"]}
        growth_kb = rounds[-1]["rss_kb"] - rounds[2]["rss_kb"]
        assert growth_kb < 8 * 1024, f"RSS grew {growth_kb} kB over 18 re-entries"
    # fault -> first step of the new round, on the rank that raised (rank 0, round 0)
    took = results[0]["first_step_after"][0] - results[0]["fault_time"][0]
    assert 0 < took < 5.0


def test_random_faults(tmp_path: Path) -> None:
    rcs, results = run_ranks(
        tmp_path, "--random", "4", "--seed", "7", "--soft", "4", "--hard", "20", timeout=120
    )
    assert rcs == [0, 0], stderr_tails(tmp_path)
    assert_completed(results, restarts=4)
