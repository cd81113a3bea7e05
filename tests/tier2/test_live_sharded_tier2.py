"""Live recovery of sharded state (FSDP2 ``fully_shard``): 2 ranks and 1 standby as
processes under the in-process wrapper on gloo, the launcher's side
(:class:`~rankguard.launcher.live.LiveRecovery`) watching them as the agent does. Each
rank declares its state once, through the checkpoint manager
(``ip.live_state(checkpoint=manager, step=...)``), which saves a local checkpoint every
step. Rank 1 SIGKILLs itself after step 3: the standby takes rank 1, every rank loads
the newest complete local step (the newcomer's shard from the replica rank 0 holds, its
own directory being another disk; or the lost process's files, on a shared disk), and
the losses of every step are those of an uninterrupted run (computed here in one
process), the per-rank RNG and data position restored with the shards. Without a
replica the persistent checkpoint is loaded, said; with no checkpoint at all the group
restarts, said. After an ordinary in-process restart (an exception, no process lost) the
sharded model built anew is loaded the same way.

Two ranks are enough for every case: each rank holds a shard of its own (FSDP2 splits
every parameter over both), the replication group (factor 2, jump 1) is the pair, so
rank 0 holds the lost rank's replica as a peer on another node would, and a rank that
is not replaced still loads its own shard of the same step. Four steps: the kill after
step 3 leaves a step before it (the one loaded when step 3 was not saved, and the
persistent step 2) and a step after it that the newcomer trains."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import WorkerState

from tests.harness.live import LiveJob, LiveRun, read_records, run_live

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]

WORLD = 2
STEPS = 4
KILL = (1, 3)  # rank 1, after step 3 (and its local save)
BATCH = 16  # global: 8 samples per rank
PERSISTENT_EVERY = 2


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 8, generator=gen)
    return x, torch.tanh(x[:, :1] - x[:, 1:2]) + 0.5


def _net() -> torch.nn.Module:
    with torch.random.fork_rng():  # the rank's own stream is left as it is
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _reference(steps: int = STEPS) -> list[float]:
    """The same job uninterrupted, in one process: the whole batch per step."""
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    out = []
    for step in range(1, steps + 1):
        x, y = _batch(step)
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _draws(rank: int, steps: int = STEPS) -> list[float]:
    """Rank ``rank``'s own random stream, one draw per step (set once per process)."""
    torch.manual_seed(100 + rank)
    return [torch.rand(1).item() for _ in range(steps)]


def _config(out: Path, slot: int, mode: str) -> Any:
    from rankguard.checkpoint import CheckpointConfig

    shared = mode == "own_dir"  # one node's disk, every process's files on it
    return CheckpointConfig(
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(out / ("local" if shared else f"local_{slot}")),
        non_persistent_save_interval=1,
        replication=mode in ("replica", "before_save"),
        replication_jump=1,
        replication_factor=2,
        save=str(out / "persistent") if mode == "persistent" else None,
        save_interval=PERSISTENT_EVERY if mode == "persistent" else None,
        dist_timeout_s=15,
    )


def _train(memory: dict[str, Any], out: Path, slot: int, mode: str) -> int:
    from torch.distributed.fsdp import fully_shard

    import rankguard.inprocess as ip
    from rankguard.checkpoint import CheckpointManager, DataPosition, RNGState

    rank, world = dist.get_rank(), dist.get_world_size()
    if not memory:  # a new process (a standby that took a rank too)
        torch.manual_seed(100 + rank)
        memory.update(step=0, pos=DataPosition())
    previous = memory.pop("ckpt", None)
    if previous is not None:  # the last round's manager: its group is gone
        try:
            previous.close()
        except Exception as exc:
            print(f"rank {rank}: previous round's manager: {exc}")
    net = _net()  # every round: the sharded model holds the round's group
    for layer in (net[0], net[2]):
        fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    pos = memory["pos"]
    state = {"model": net, "optim": opt, "rng": RNGState(), "data": pos}
    lws = WORLD if mode == "own_dir" else 1  # a node per rank, or one node
    ckpt = CheckpointManager(
        _config(out, slot, mode), state, job_id="job", session=False, local_world_size=lws
    )
    memory["ckpt"] = ckpt
    memory["step"] = done = ip.live_state(checkpoint=ckpt, step=memory["step"])
    for step in range(done + 1, STEPS + 1):
        x, y = _batch(pos.index + 1)  # the data position: where the rank is in its data
        per = BATCH // world
        xs, ys = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        with ip.atomic():
            opt.zero_grad()
            loss = ((net(xs) - ys) ** 2).mean()
            loss.backward()
            opt.step()
            draw = torch.rand(1).item()
            pos.index += 1
            memory["step"] = step
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if (slot, step) == KILL and mode == "before_save" and ip.restart_count() == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # its step done, its local save not
        ckpt.maybe_save(step)
        with (out / f"{slot}.jsonl").open("a") as f:
            rec = {"step": step, "rank": rank, "loss": float(mean) / world, "draw": draw}
            f.write(json.dumps({**rec, "pid": os.getpid(), "round": ip.restart_count()}) + "\n")
        if step == KILL[1] and ip.restart_count() == 0 and mode != "before_save":
            # every rank's save and record of this step are done before rank 1 goes (a
            # survivor interrupted between them left its record out)
            dist.barrier()
        if (slot, step) == KILL and ip.restart_count() == 0:
            if mode == "raise":  # an ordinary in-process restart: every process kept
                raise RuntimeError(f"rank {rank}: an error after step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt.close()
    memory.pop("ckpt", None)
    return 0


_CONFIG = {
    "soft_timeout": 30,
    "hard_timeout": 60,
    "monitor_thread_interval": 0.2,
    "heartbeat_interval": 0.2,
    "heartbeat_timeout": 5,
    "barrier_timeout": 60,
    "process_group_timeout": 15,
}


def _run(tmp_path: Path, mode: str) -> LiveRun:
    """2 ranks and 1 standby, no refill; after a FAILED result the ranks leave by
    themselves (the wrapper's abandon) before anything is killed."""
    job = LiveJob(world=WORLD, train=_train, args=(mode,), config=_CONFIG)
    return run_live(tmp_path, job, standbys=1, refills=0, deadline_s=200, poll_s=0.05, leave_s=30)


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    return read_records(tmp_path, WORLD + 1, "slot")


def _console(tmp_path: Path) -> str:
    """What the ranks wrote to their consoles (rank 0's, the newcomer's last)."""
    return "".join((tmp_path / f"stderr_{s}").read_text() for s in range(WORLD + 1))


def _check_recovered(tmp_path: Path, mode: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The common assertions: no group restart, the survivors kept their processes, the
    standby trained as rank 1, the losses and each rank's draws those of an
    uninterrupted run at every step; the recovery's line."""
    run = _run(tmp_path, mode)
    result, said, entries, codes = run.result, run.said, run.entries, run.codes
    assert result is not None and result.state == WorkerState.SUCCEEDED, (result, said)
    assert codes == {0: 0, 1: -signal.SIGKILL, 2: 0}
    recs = _records(tmp_path)
    pids = {s: {r["pid"] for r in recs if r["slot"] == s} for s in range(WORLD + 1)}
    assert all(len(p) == 1 for p in pids.values()), pids
    newcomer = [r for r in recs if r["slot"] == WORLD]
    assert newcomer and {r["rank"] for r in newcomer} == {1}
    ref = _reference()
    draws = {r: _draws(r) for r in range(WORLD)}
    assert recs, said
    for r in recs:  # every record of every process, the steps redone included
        assert r["loss"] == pytest.approx(ref[r["step"] - 1], rel=1e-5), r
        assert r["draw"] == draws[r["rank"]][r["step"] - 1], r  # RNG restored
    for rank in range(WORLD):  # each rank ran every step, and the last ones after the loss
        steps = {r["step"] for r in recs if r["rank"] == rank}
        assert steps == set(range(1, STEPS + 1)), (rank, steps)
    assert [s for s in said if s.startswith("live recovery: rank 1 (pid")], said
    assert len(entries) == 1
    entry = entries[0].to_dict()
    # status.json's live block says where the newcomer's state came from, as the line does
    (replaced,) = run.status["replaced"]
    assert (replaced["lost_rank"], replaced["source"]) == (1, entry["source"]), run.status
    return recs, entry


def test_the_newcomer_shard_comes_from_the_replica_and_the_losses_are_kept(tmp_path: Path) -> None:
    recs, entry = _check_recovered(tmp_path, "replica")
    first = min(r["step"] for r in recs if r["slot"] == WORLD)
    assert first == KILL[1] + 1  # the local step the kill came after: nothing redone
    assert entry["kind"] == "live_recovery" and entry["lost_rank"] == 1
    assert entry["source"] == f"local checkpoint step {KILL[1]}: replica on rank 0"
    assert entry["steps_redone"] == 0 and entry["resumed_step"] == KILL[1] + 1
    assert entry["message"].endswith(f"; state from {entry['source']}")
    err = _console(tmp_path)
    assert (
        f"live recovery: sharded state from local checkpoint step {KILL[1]} (rank 1's shard "
        f"from the replica on rank 0); every rank continues after step {KILL[1]}, 0 step(s) "
        "redone"
    ) in err
    assert "rank 1's shard restored from the replica on rank 0" in err


def test_a_step_done_but_not_saved_is_done_again(tmp_path: Path) -> None:
    """Rank 1 is lost after its step 3, before its local save: step 3 is incomplete (no
    copy of rank 1's shard), every rank continues after step 2, the survivor redoes step 3."""
    recs, entry = _check_recovered(tmp_path, "before_save")
    assert entry["source"] == f"local checkpoint step {KILL[1] - 1}: replica on rank 0"
    assert entry["steps_redone"] == 1 and entry["resumed_step"] == KILL[1]
    assert min(r["step"] for r in recs if r["slot"] == WORLD) == KILL[1]
    assert (
        f"every rank continues after step {KILL[1] - 1}, 1 step(s) redone, the survivors had "
        f"completed step {KILL[1]}"
    ) in _console(tmp_path)


def test_after_an_ordinary_in_process_restart_the_sharded_state_is_reloaded(
    tmp_path: Path,
) -> None:
    """Rank 1 raises after step 3: no process lost, no standby used; every rank builds
    its sharded model anew in the next round, and ``live_state`` loads local step 3
    into it (a model left as built would train on from its initial weights)."""
    run = _run(tmp_path, "raise")
    result, said, entries, codes = run.result, run.said, run.entries, run.codes
    assert result is not None and result.state == WorkerState.SUCCEEDED, (result, said)
    assert codes == {s: 0 for s in range(WORLD + 1)} and entries == [] and said == []
    recs = _records(tmp_path)
    ref = _reference()
    draws = {r: _draws(r) for r in range(WORLD)}
    for rank in range(WORLD):
        mine = [r for r in recs if r["rank"] == rank]
        assert [r["step"] for r in mine] == list(range(1, STEPS + 1))
        assert {r["round"] for r in mine if r["step"] > KILL[1]} == {1}
        for r in mine:
            assert r["loss"] == pytest.approx(ref[r["step"] - 1], rel=1e-5), r
            assert r["draw"] == draws[rank][r["step"] - 1], r
    assert (
        f"in-process restart 1: sharded state from local checkpoint step {KILL[1]}; every "
        f"rank continues after step {KILL[1]}, 0 step(s) redone"
    ) in _console(tmp_path)


def test_on_one_disk_the_newcomer_reads_the_lost_process_files(tmp_path: Path) -> None:
    _recs, entry = _check_recovered(tmp_path, "own_dir")
    assert entry["source"] == f"local checkpoint step {KILL[1]}: rank 1's own local directory"
    assert entry["steps_redone"] == 0
    assert "rank 1's shard from its own local directory (the lost process's files" in (
        _console(tmp_path)
    )


def test_without_a_replica_the_persistent_checkpoint_is_loaded_and_said(tmp_path: Path) -> None:
    recs, entry = _check_recovered(tmp_path, "persistent")
    saved = KILL[1] - KILL[1] % PERSISTENT_EVERY  # step 2
    assert entry["source"] == f"checkpoint step {saved} (persistent)"
    assert entry["steps_redone"] == KILL[1] - saved and entry["resumed_step"] == saved + 1
    # the survivor ran step 3 twice, with the same loss
    assert [r["step"] for r in recs if r["slot"] == 0] == [
        *range(1, KILL[1] + 1),
        *range(saved + 1, STEPS + 1),
    ]
    err = _console(tmp_path)
    assert f"local checkpoint step {KILL[1]} is incomplete: no verified copy of rank(s) [1]" in err
    assert (
        "live recovery: sharded state from no complete local checkpoint step (no rank holds "
        f"a verified copy of every rank's shard): checkpoint step {saved} (persistent); every "
        f"rank continues after step {saved}, {KILL[1] - saved} step(s) redone, the survivors "
        f"had completed step {KILL[1]}"
    ) in err


def test_with_no_copy_at_all_the_group_restarts_said(tmp_path: Path) -> None:
    run = _run(tmp_path, "none")
    result, said, codes = run.result, run.said, run.codes
    assert result is not None and result.state == WorkerState.FAILED, (result, said)
    assert codes[1] == -signal.SIGKILL
    assert {codes[s] for s in (0, 2)} == {3}  # every rank left the in-process restart
    why = (tmp_path / "error_0").read_text()
    assert "live recovery cannot continue: rank(s) [1] replaced, but no copy of the sharded" in why
    assert why.endswith("the worker group restarts")
