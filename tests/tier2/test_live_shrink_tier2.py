"""Live recovery with no standby left (``inprocess_restart.shrink_when_no_standby``):
4 ranks as processes under the in-process wrapper on gloo, the launcher's side
(:class:`~rankguard.launcher.live.LiveRecovery`) watching them as the agent does, every
standby already used. Rank 2 SIGKILLs itself after step 5: the launcher drops it, the 3
others keep their processes, re-enter in process as ranks 0-2 (old rank 3 is rank 2),
and train on with the global batch kept (the batch rule: 4 micro-batches of 2 per rank
instead of 3). Their losses are those of a data-parallel job of that global batch, step
for step (computed here in one process), before the loss and after it. Without the
config key, the same loss is the group restart of today, said in one line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import WorkerState

from tests.harness.live import LiveJob, read_records, run_live

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(180)]

WORLD = 4
STEPS = 12
KILL = (2, 5)  # rank 2 after step 5
GLOBAL_BATCH, MICRO = 24, 2


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: the same samples whatever the world size."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.5 + 1.0


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    return net, torch.optim.SGD(net.parameters(), lr=0.05)


def _reference(steps: int = STEPS) -> list[float]:
    """The losses of the same job in one process: the whole global batch per step."""
    net, opt = _model()
    out = []
    for step in range(1, steps + 1):
        x, y = _batch(step)
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).sum() / GLOBAL_BATCH
        loss.backward()
        opt.step()
        out.append(loss.detach().item())
    return out


def _train(memory: dict[str, Any], out: Path, rank0: int, steps: int, pause: float) -> int:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rankguard.inprocess as ip
    from rankguard.rank import runenv

    rank, world = dist.get_rank(), dist.get_world_size()
    if not memory:
        net, opt = _model()
        memory.update(net=net, opt=opt, step=0)
    net, opt = memory["net"], memory["opt"]
    memory["step"] = ip.live_state(model=net, optimizer=opt, step=memory["step"])
    env = runenv.current()  # the script's view: the round's numbers
    plan = env.batch_plan(GLOBAL_BATCH, MICRO)
    model = DDP(net)
    for step in range(memory["step"] + 1, steps + 1):
        x, y = _batch(step)
        per = plan.samples_per_rank
        xs, ys = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        with ip.atomic():
            opt.zero_grad()
            local = torch.zeros(1)
            for i in range(plan.accumulation_steps):
                part = slice(i * MICRO, (i + 1) * MICRO)
                last = i == plan.accumulation_steps - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    err = ((model(xs[part]) - ys[part]) ** 2).sum() / GLOBAL_BATCH
                    (err * world).backward()  # DDP averages over the world
                local += err.detach()
            dist.all_reduce(local)
            opt.step()
            memory["step"] = step
        with (out / f"{rank0}.jsonl").open("a") as f:
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "rank": rank,
                        "world": world,
                        "env": [env.rank, env.world_size],
                        "accum": plan.accumulation_steps,
                        "loss": float(local),
                        "pid": os.getpid(),
                    }
                )
                + "\n"
            )
        if (rank0, step) == KILL and ip.restart_count() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if world < WORLD:  # shrunk: slower, so that the standby can come back meanwhile
            time.sleep(pause)
    return 0


_CONFIG = {
    "soft_timeout": 20,
    "hard_timeout": 40,
    "monitor_thread_interval": 0.1,
    "heartbeat_interval": 0.1,
    "heartbeat_timeout": 3,
    "barrier_timeout": 30,
    "process_group_timeout": 10,
}


def _run(
    tmp_path: Path, *, shrink: bool, standby: bool = False, steps: int = STEPS, pause: float = 0.0
) -> tuple[Any, list[str], list[Any], dict[int, int | None]]:
    """Without ``standby``, every standby is used already; with it, one is still starting
    (as a refill would be: held until the gate opens) when rank 2 is lost, and reaches
    its wait once the launcher said the job shrank and rank 0 trained a step in the
    shrunk job (a standby whose imports are all preloaded is at its wait within a step:
    the job would grow back before any step showed the shrink)."""
    job = LiveJob(
        world=WORLD,
        train=_train,
        args=(steps, pause),
        config={**_CONFIG, "shrink_when_no_standby": shrink},
        gate=True,
    )

    def open_gate(said: list[str]) -> None:
        if standby and any("no standby left" in line for line in said) and _shrunk(tmp_path):
            (tmp_path / "gate").touch()

    run = run_live(
        tmp_path,
        job,
        standbys=int(standby),
        starting=(WORLD,) if standby else (),
        deadline_s=150,
        poll_s=0.02,
        on_poll=open_gate,
    )
    return run.result, run.said, run.entries, run.codes


def _shrunk(tmp_path: Path) -> bool:
    """Rank 0 recorded a step in a job of fewer than ``WORLD`` ranks."""
    path = tmp_path / "0.jsonl"
    if not path.exists():
        return False
    lines = path.read_text().splitlines()
    return any(json.loads(line)["world"] < WORLD for line in lines if line.endswith("}"))


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    return read_records(tmp_path, WORLD + 1, "orig")


def test_no_standby_left_the_job_goes_on_with_three_ranks(tmp_path: Path) -> None:
    result, said, entries, codes = _run(tmp_path, shrink=True)
    assert result is not None and result.state == WorkerState.SUCCEEDED, (result, said)
    assert codes == {0: 0, 1: 0, 2: -signal.SIGKILL, 3: 0}
    recs = _records(tmp_path)
    # one process per rank over the run: the survivors kept theirs
    assert {r["orig"]: {x["pid"] for x in recs if x["orig"] == r["orig"]} for r in recs} == {
        r: {next(x["pid"] for x in recs if x["orig"] == r)} for r in range(WORLD)
    }
    before = [r for r in recs if r["step"] <= KILL[1]]
    after = [r for r in recs if r["step"] > KILL[1]]
    assert {(r["orig"], r["rank"], r["world"], r["accum"]) for r in before} == {
        (p, p, 4, 3) for p in range(WORLD)
    }
    # renumbered in order: old 3 is rank 2; the script's environment says so too
    assert {(r["orig"], r["rank"], r["world"], r["accum"]) for r in after} == {
        (0, 0, 3, 4),
        (1, 1, 3, 4),
        (3, 2, 3, 4),
    }
    assert all(r["env"] == [r["rank"], r["world"]] for r in recs)
    assert sorted(r["step"] for r in after if r["orig"] == 0) == list(range(6, STEPS + 1))
    # the losses of a data-parallel job of the same global batch, every step
    losses = {r["step"]: r["loss"] for r in recs if r["orig"] == 0}
    ref = _reference()
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in losses.items():
        assert loss == pytest.approx(ref[step - 1], rel=1e-5, abs=1e-7), step
    # the launcher: one line, no group restart; the recovery's line with its cost
    line = next(s for s in said if "no standby left" in s)
    assert "rank 2 (pid" in line and "the job goes on with 3 of 4 rank(s) in process" in line
    assert "renumbered: 3->2" in line and "no group restart" in line
    assert len(entries) == 1
    entry = entries[0].to_dict()
    assert entry["kind"] == "live_recovery" and entry["shrink"] is True
    assert entry["lost_rank"] == 2 and entry["standby_pid"] is None
    assert entry["world_size"] == 3 and entry["renumbered"] == {"3": 2}
    assert entry["resumed_step"] == KILL[1] + 1 and entry["steps_redone"] == 0
    assert 0 <= entry["recovery_s"] < 30


def test_without_the_key_the_group_restarts_said_in_one_line(tmp_path: Path) -> None:
    result, said, _entries, _codes = _run(tmp_path, shrink=False)
    assert result is not None and result.state == WorkerState.FAILED
    assert said == [
        next(s for s in said if s.startswith("live recovery cannot apply: rank 2 (SIGKILL)"))
    ]
    assert said[0].endswith("lost and no standby left on this node: the worker group restarts")


def test_a_standby_ready_after_the_shrink_grows_the_job_back(tmp_path: Path) -> None:
    """A refill still starting when rank 2 is lost is not waited for: the job shrinks to
    3 ranks at once, and once the standby is at its wait it takes rank 2 back: 4 ranks
    again, its state from a survivor; the losses stay those of the same global batch."""
    steps = 60
    result, said, entries, codes = _run(tmp_path, shrink=True, standby=True, steps=steps, pause=0.3)
    assert result is not None and result.state == WorkerState.SUCCEEDED, (result, said)
    assert codes == {0: 0, 1: 0, 2: -signal.SIGKILL, 3: 0, 4: 0}
    recs = _records(tmp_path)
    worlds = {r["step"]: r["world"] for r in recs if r["orig"] == 0}
    assert sorted(worlds) == list(range(1, steps + 1))
    shrunk = [s for s, w in worlds.items() if w == 3]
    assert shrunk and min(shrunk) == KILL[1] + 1, worlds
    assert worlds[steps] == 4 and all(worlds[s] == 4 for s in range(max(shrunk) + 1, steps + 1))
    # the standby trained as rank 2 of 4 from the step after the shrunk world's last
    newcomer = [r for r in recs if r["orig"] == WORLD]
    assert newcomer and {(r["rank"], r["world"], r["accum"]) for r in newcomer} == {(2, 4, 3)}
    assert min(r["step"] for r in newcomer) == max(shrunk) + 1
    assert {
        (r["rank"], r["world"]) for r in recs if r["orig"] == 3 and r["step"] > max(shrunk)
    } == {(3, 4)}
    ref = _reference(steps)
    losses = {r["step"]: r["loss"] for r in recs if r["orig"] == 0}
    for step, loss in losses.items():
        assert loss == pytest.approx(ref[step - 1], rel=1e-5, abs=1e-7), step
    grow = next(s for s in said if "takes dropped rank" in s)
    assert grow.startswith(
        f"live recovery: standby pid {next(iter(newcomer))['pid']} takes dropped rank 2"
    )
    assert "the job grows back to 4 rank(s) in process; no group restart" in grow
    lines = sorted((e.to_dict() for e in entries), key=lambda e: e["restart"])
    assert [(e.get("shrink"), e.get("grow")) for e in lines] == [(True, None), (None, True)]
    assert lines[1]["lost_rank"] == 2 and lines[1]["world_size"] == 4
    assert lines[1]["resumed_step"] == max(shrunk) + 1
