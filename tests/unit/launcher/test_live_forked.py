"""Live recovery with ranks forked by ``--preload``'s fork server
(:mod:`rankguard.launcher.live_forked`): real processes of a torch elastic
``MultiprocessContext`` forked from Python's fork server, an in-memory store."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

from rankguard.launcher.live import LiveRecovery
from rankguard.live.keys import LiveKeys
from tests.factories import DictStore

pytestmark = pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server"
)


def wait_for_file(path: str) -> str:
    """A worker: runs until ``path`` exists (the test's "training completed")."""
    while not os.path.exists(path):
        time.sleep(0.02)
    return "returned"


@pytest.fixture
def forked(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A rank (slot 0) and a standby (slot 1) forked from the fork server, as torch
    elastic starts them under ``--preload``."""
    # the server's children unpickle torch elastic's _wrap: torch imported once, there
    multiprocessing.set_forkserver_preload(["torch.distributed.elastic.multiprocessing.api"])
    go = str(tmp_path / "go")
    pcontext = start_processes(
        name="trainer",
        entrypoint=wait_for_file,
        args={0: (go,), 1: (go,)},
        envs={0: {"LOCAL_RANK": "0"}, 1: {"LOCAL_RANK": "1"}},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        start_method="forkserver",
    )
    try:
        yield pcontext, go
    finally:
        pcontext.close(signal.SIGKILL, 5)


def _poll_until(
    live: LiveRecovery, group: Any, pcontext: Any, done: Callable[[RunResult], bool]
) -> RunResult:
    deadline = time.monotonic() + 60
    while True:
        result = live.poll(group, pcontext)
        if done(result):
            return result
        assert time.monotonic() < deadline, result
        time.sleep(0.02)


def test_a_forked_rank_lost_goes_to_the_standby_and_a_refill_is_forked_too(
    forked: tuple[Any, str],
) -> None:
    pcontext, go = forked
    store = DictStore()
    lines: list[str] = []
    live = LiveRecovery(
        run_id="r1",
        nproc=1,
        standbys=1,
        say=lines.append,
        store_factory=lambda host, port: store,
        refills=None,
    )
    group = SimpleNamespace(
        group_rank=0,
        master_addr="127.0.0.1",
        master_port=1,
        workers=[SimpleNamespace(global_rank=s, world_size=2) for s in range(2)],
    )
    live.started(group, 0)
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    rank_pid, standby_pid = pcontext.pids()[0], pcontext.pids()[1]
    assert live.poll(group, pcontext).state == WorkerState.HEALTHY

    os.kill(rank_pid, signal.SIGKILL)
    _poll_until(live, group, pcontext, lambda r: bool(live.replaced))
    assert live.holders[0] == 1  # the standby's slot holds rank 0 now
    assert lines[0] == (
        f"live recovery: rank 0 (pid {rank_pid}, SIGKILL) is taken over by standby pid "
        f"{standby_pid}; no group restart (0 standby(s) left on this node)"
    )
    # the refill: forked into the lost rank's slot, a process of the context
    refill = pcontext.pids()[0]
    assert refill not in (rank_pid, standby_pid)
    assert f"new standby pid {refill} started in place of rank 0's lost process" in lines[1]
    assert live.waiting == [0]
    store.set(keys.waiting(refill), "1")  # at its wait: said with its start's time
    _poll_until(live, group, pcontext, lambda r: len(lines) > 2)
    assert lines[2].startswith(f"live recovery: new standby pid {refill} ready (")
    assert len(live.ready_s) == 1

    # training completes: every process returned; they exit once released
    Path(go).touch()
    result = _poll_until(live, group, pcontext, lambda r: r.state != WorkerState.HEALTHY)
    assert result.state == WorkerState.SUCCEEDED
    assert live.completed == {0} and live.left_unused == 1
    procs = pcontext._pc.processes
    for proc in procs:
        proc.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert pcontext._return_values == {0: "returned", 1: "returned"}
