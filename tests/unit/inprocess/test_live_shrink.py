"""No standby left (``inprocess_restart.live_shrink``): a rank's process is lost and the
others go on in process with one rank fewer, renumbered, the global batch kept; a
standby started meanwhile grows the job back.

Four ranks as processes on gloo (tests/e2e/scripts/live_shrink_train.py, forked from the
rank tests' forkserver) and the launcher's side, :class:`~rankguard.launcher.live.
LiveRecovery`, watching them as the agent does (no standby left on the node): rank 1
SIGKILLs itself after step 5; the survivors keep their processes, become ranks 0..2 of 3
and accumulate 4 micro-batches a step instead of 3, and every step's loss is that of a
run without the fault. Then the same with a standby that ended early: the lost rank's
process is refilled by a new standby, which joins as rank 3 and the job is 4 ranks
again, still with every step's loss of the run without faults."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.elastic.agent.server.api import WorkerState

from rankguard.launcher.live import LiveRecovery
from rankguard.schema.restarts import LostRank

pytestmark = pytest.mark.ranks

SCRIPT = Path(__file__).parents[2] / "e2e" / "scripts" / "live_shrink_train.py"
ROOT = Path(__file__).parents[3]
WORLD, STEPS, KILLED, AFTER = 4, 12, 1, 5
DIM, GLOBAL_BATCH, LR = 8, 12, 0.05


def _rank_process(argv: list[str], env: dict[str, str], err: str) -> None:
    """One rank: the script as ``__main__`` with the rank's environment, its standard
    output discarded, its standard error to ``err``."""
    import runpy

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, os.devnull), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


class _Proc:
    """A rank's process as the agent's handler shows it (``Popen``'s ``poll``)."""

    def __init__(self, process: Any) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def poll(self) -> int | None:
        code = self.process.exitcode
        return None if code is None else int(code)


def _reference(steps: int = STEPS) -> tuple[list[float], list[float]]:
    """The losses of every step and the final weights without a fault."""
    net = torch.nn.Linear(DIM, 1, bias=False)
    torch.nn.init.zeros_(net.weight)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for i in range(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH):
            x = torch.linspace(-1, 1, DIM) * (1 + i % 5) / 5
            y = torch.tensor([float(i % 7) / 7])
            loss = ((net(x) - y) ** 2).sum() / GLOBAL_BATCH
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
    return losses, [float(v) for v in net.weight.detach().reshape(-1)]


def _tails(out: Path) -> str:
    return "\n".join(
        f"--- rank {r}\n{(out / f'rank_{r}.stderr').read_text()[-3000:]}" for r in range(WORLD)
    )


def test_a_rank_lost_with_no_standby_left_the_others_go_on_with_fewer(tmp_path: Path) -> None:
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
        TORCHELASTIC_RUN_ID="shrink",
        RANKGUARD_STANDBY_RANKS="1",  # the run has standbys; none is left
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        TORCH_CPP_LOG_LEVEL="error",
    )
    env.pop("RANKGUARD_LAUNCHER", None)
    argv = [str(SCRIPT), "--out", str(tmp_path), "--steps", str(STEPS)]
    argv += ["--kill", f"{KILLED}:{AFTER}"]
    ctx = rank_context()
    procs = [
        ctx.Process(
            target=_rank_process,
            args=(
                argv,
                {**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                str(tmp_path / f"rank_{r}.stderr"),
            ),
        )
        for r in range(WORLD)
    ]
    lines: list[str] = []
    lost: list[LostRank] = []
    live = LiveRecovery(
        run_id="shrink",
        nproc=WORLD,
        standbys=0,
        say=lines.append,
        on_lost=lost.append,
        store_factory=lambda host, port: dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10)
        ),
        refills=0,  # the standbys used and none started in their place
        shrink=True,
    )
    group = SimpleNamespace(
        group_rank=0,
        master_addr="127.0.0.1",
        master_port=store.port,
        workers=[SimpleNamespace(global_rank=r) for r in range(WORLD)],
    )
    live.started(group, 0)
    for proc in procs:
        proc.start()
    pcontext = SimpleNamespace(
        subprocess_handlers={r: SimpleNamespace(proc=_Proc(p)) for r, p in enumerate(procs)},
        error_files={r: "" for r in range(WORLD)},
    )
    deadline = time.monotonic() + 120
    try:
        while True:  # the agent's watch
            state = live.poll(group, pcontext).state
            if state != WorkerState.HEALTHY or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert state == WorkerState.SUCCEEDED, _tails(tmp_path)
    finally:
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
            proc.join(10)
    assert [p.exitcode for p in procs] == [0, -9, 0, 0]
    assert lines == [
        "live recovery: rank 1 lost, no standby left: going on with 3 ranks (data "
        "parallel); no group restart"
    ]
    # the finding naming the lost rank: no standby, the ranks after
    assert [(x.rank, x.pid, x.standby_pid, x.ranks_after) for x in lost] == [
        (1, procs[1].pid, None, 3)
    ]
    ref_losses, ref_w = _reference()
    for launched, (rank, accumulation) in {0: (0, 4), 2: (1, 4), 3: (2, 4)}.items():
        res = json.loads((tmp_path / f"rank_{launched}.json").read_text())
        first, second = res["rounds"]
        assert (first["rank"], first["world"], first["accumulation"]) == (launched, 4, 3)
        # renumbered 0..2 of 3, as RANK/WORLD_SIZE and torch.distributed say; the global
        # batch kept (keep_global): 4 micro-batches a step instead of 3
        assert (second["rank"], second["world"], second["accumulation"]) == (
            rank,
            3,
            accumulation,
        )
        assert second["dist"] == [rank, 3] and res["env"] == [str(rank), "3"]
        assert second["cause"] == "rank_lost_shrink" and second["step"] == AFTER
        assert [res["losses"][str(s)] for s in range(STEPS)] == pytest.approx(ref_losses, abs=1e-6)
        assert res["final_w"] == pytest.approx(ref_w, abs=1e-6)
    # the recovery's line: cause, ranks before and after, its cost
    (entry,) = live.entries_due(final=True)
    line = entry.to_dict()
    assert line["kind"] == "live_recovery" and line["standby_pid"] is None
    assert line["shrink"] == {"ranks_before": 4, "ranks_after": 3, "renumbered": {"2": 1, "3": 2}}
    assert (line["lost_rank"], line["lost_pid"], line["exit"]) == (1, procs[1].pid, "SIGKILL")
    assert line["steps_redone"] == 0 and line["resumed_step"] == AFTER + 1
    assert 0 < line["recovery_s"] < 30
    status = live.status()
    assert status.ranks == 3
    assert [(x.lost_rank, x.ranks_before, x.ranks_after) for x in status.shrunk] == [(1, 4, 3)]


def test_a_standby_started_after_a_shrink_grows_the_job_back(tmp_path: Path) -> None:
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
        TORCHELASTIC_RUN_ID="grow",
        RANKGUARD_STANDBY_RANKS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        TORCH_CPP_LOG_LEVEL="error",
    )
    env.pop("RANKGUARD_LAUNCHER", None)
    steps = 60
    argv = [str(SCRIPT), "--out", str(tmp_path), "--steps", str(steps), "--step-s", "0.1"]
    argv += ["--kill", f"{KILLED}:{AFTER}"]
    ctx = rank_context()

    def process(rank: int, extra: dict[str, str]) -> Any:
        err = str(tmp_path / f"rank_{rank}.stderr")
        return ctx.Process(
            target=_rank_process,
            args=(argv, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), **extra}, err),
        )

    procs = [process(r, {}) for r in range(WORLD)]
    started: list[Any] = []

    def start(**kw: Any) -> Any:  # the launcher's refill: a standby of this node
        proc = process(WORLD, {"RANKGUARD_STANDBY": "1"})
        proc.start()
        started.append(proc)
        return SimpleNamespace(proc=_Proc(proc))

    lines: list[str] = []
    live = LiveRecovery(
        run_id="grow",
        nproc=WORLD,
        standbys=1,
        say=lines.append,
        store_factory=lambda host, port: dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10)
        ),
        start=start,
        refills=1,
        shrink=True,
    )
    group = SimpleNamespace(
        group_rank=0,
        master_addr="127.0.0.1",
        master_port=store.port,
        workers=[SimpleNamespace(global_rank=r) for r in range(WORLD + 1)],
    )
    live.started(group, 0)
    gone = SimpleNamespace(pid=1, poll=lambda: 1)  # the node's standby ended early
    handlers = {r: SimpleNamespace(proc=_Proc(p)) for r, p in enumerate(procs)}
    handlers[WORLD] = SimpleNamespace(proc=gone)
    pcontext = SimpleNamespace(
        subprocess_handlers=handlers,
        error_files={r: "" for r in range(WORLD + 1)},
        envs={WORLD: {}},
        args={WORLD: ()},
        entrypoint="python",
        stdouts={},
        stderrs={},
    )
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 150
    try:
        while True:  # the agent's watch
            state = live.poll(group, pcontext).state
            if state != WorkerState.HEALTHY or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert state == WorkerState.SUCCEEDED, _tails(tmp_path)
    finally:
        for proc in procs + started:
            if proc.exitcode is None:
                proc.kill()
            proc.join(10)
    (standby,) = started
    assert [p.exitcode for p in procs] == [0, -9, 0, 0] and standby.exitcode == 0
    assert lines[1] == (
        "live recovery: rank 1 lost, no standby left: going on with 3 ranks (data "
        "parallel); no group restart"
    )
    assert lines[-1] == (
        f"live recovery: standby pid {standby.pid} joins as rank 3: the job grows back to "
        "4 ranks at its next step boundary"
    )
    ref_losses, ref_w = _reference(steps)
    for launched, ranks in {0: [0, 0, 0], 2: [2, 1, 1], 3: [3, 2, 2], 4: [3]}.items():
        res = json.loads((tmp_path / f"rank_{launched}.json").read_text())
        rounds = res["rounds"]
        assert [r["rank"] for r in rounds] == ranks
        # 4 ranks, 3 after the loss, 4 again: 3, 4, then 3 micro-batches a step
        worlds = [4, 3, 4][-len(rounds) :]
        assert [(r["world"], r["accumulation"]) for r in rounds] == [
            (w, GLOBAL_BATCH // w) for w in worlds
        ]
        assert [r["cause"] for r in rounds][-1] == "ranks_joined"
        done = [int(s) for s in res["losses"]]
        assert done == list(range(min(done), steps))
        assert [res["losses"][str(s)] for s in done] == pytest.approx(
            ref_losses[min(done) :], abs=1e-6
        )
        assert res["final_w"] == pytest.approx(ref_w, abs=1e-6)
    entries = {e.to_dict()["cause"]: e.to_dict() for e in live.entries_due(final=True)}
    grow = entries["ranks_joined"]
    assert (grow["rank"], grow["standby_pid"], grow["grow"]) == (
        3,
        standby.pid,
        {"ranks_before": 3, "ranks_after": 4},
    )
    assert grow["recovery_s"] is not None and grow["steps_redone"] == 0
    assert live.status().ranks == 4
