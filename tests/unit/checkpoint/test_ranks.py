"""CheckpointManager with 1, 2 and 4 ranks as forked processes on gloo: DDP models,
sync and async saves (1 and 2 ranks: a third or fourth rank saves and loads as the
second does), resharding, local shards replicated to peers (4 ranks on 2 nodes), a
node's local directory lost, a rank killed in the middle of a save."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.nn.parallel import DistributedDataParallel as DDP

from rankguard.checkpoint import CheckpointConfig, CheckpointManager, DataPosition, RNGState
from rankguard.checkpoint.files import COMMIT_MARKER
from tests.factories import run_ranks

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]


def _trainer(rank: int, seed: int = 0) -> tuple[DDP, torch.optim.Optimizer, DataPosition]:
    torch.manual_seed(seed)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    return model, opt, DataPosition()


def _step(model: DDP, opt: torch.optim.Optimizer, data: DataPosition, rank: int) -> float:
    gen = torch.Generator().manual_seed(1000 * data.index + rank)
    loss = model(torch.randn(4, 6, generator=gen)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    data.index += 1
    return float(loss.detach())


def _config(root: Path, rank: int, lws: int, **kw: Any) -> CheckpointConfig:
    if kw.pop("local", False):
        node = rank // lws
        kw.update(
            non_persistent_ckpt_type="local",
            non_persistent_local_ckpt_dir=str(root / f"node{node}"),
        )
    return CheckpointConfig(save=str(root / "persistent"), **kw)


def _train_then_resume(
    rank: int,
    world: int,
    root: Path,
    kw: dict[str, Any],
    lws: int,
    lose_node: int | None,
    steps: int = 5,
) -> dict[str, Any]:
    model, opt, data = _trainer(rank)
    state = {"model": model, "optim": opt, "data": data, "rng": RNGState()}
    config = _config(root, rank, lws, **kw)
    m = CheckpointManager(config, state, job_id="job", local_world_size=lws, session=False)
    losses = []
    for step in range(1, steps + 1):
        losses.append(_step(model, opt, data, rank))
        m.maybe_save(step)
    m.close()
    committed = dict(m.last_committed)
    weights = [p.detach().clone() for p in model.parameters()]
    next_loss = _step(model, opt, data, rank)
    dist.barrier()
    if lose_node is not None and rank == 0:
        shutil.rmtree(root / f"node{lose_node}")
    dist.barrier()
    model2, opt2, data2 = _trainer(rank, seed=42)
    state2 = {"model": model2, "optim": opt2, "data": data2, "rng": RNGState()}
    m2 = CheckpointManager(config, state2, job_id="job", local_world_size=lws, session=False)
    step = m2.load_latest()
    m2.close()
    same = all(torch.equal(a, b) for a, b in zip(weights, model2.parameters(), strict=True))
    return {
        "committed": committed,
        "loaded": step,
        "same": same,
        "index": data2.index,
        "next": next_loss,
        "next2": _step(model2, opt2, data2, rank),
    }


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_every_rank_resumes_the_same_step_and_continues_identically(
    tmp_path: Path, world: int, async_save: bool
) -> None:
    kw = {"save_interval": 2, "async_save": async_save}
    results = run_ranks(
        world, _train_then_resume, tmp_path, kw, 1, None, 4, store_dir=tmp_path, timeout_s=90
    )
    for r in results:
        assert r["committed"]["persistent"] == 4 and r["loaded"] == 4
        assert r["same"] and r["index"] == 4
        assert r["next2"] == pytest.approx(r["next"], rel=1e-6)
    # rank 0's DCP metadata and every rank's shard, per-rank state and manifest
    d = tmp_path / "persistent" / "step_000000004"
    names = set(os.listdir(d))
    assert {f"rank_{r}.state" for r in range(world)} <= names
    assert {".metadata", "manifest.json", COMMIT_MARKER} <= names


def test_local_shards_replicated_to_the_next_node_survive_a_lost_node(tmp_path: Path) -> None:
    """4 ranks, 2 per node; node 1's local directory is deleted; its ranks' shards come
    back from the replicas on node 0 (and the local step 5 is newer than persistent 4)."""
    kw = {
        "save_interval": 4,
        "non_persistent_save_interval": 1,
        "local": True,
        "replication": True,
        "async_save": True,
    }
    results = run_ranks(4, _train_then_resume, tmp_path, kw, 2, 1, store_dir=tmp_path)
    for r in results:
        assert r["committed"] == {"persistent": 4, "local": 5}
        assert r["loaded"] == 5 and r["same"] and r["index"] == 5
        assert r["next2"] == pytest.approx(r["next"], rel=1e-6)
    node0 = tmp_path / "node0" / "step_000000005"
    assert sorted(os.listdir(node0)) == [
        "shard_0_on_0",
        "shard_1_on_1",
        "shard_2_on_0",
        "shard_3_on_1",
    ]


def test_without_replicas_a_lost_node_falls_back_to_persistent(tmp_path: Path) -> None:
    kw = {"save_interval": 4, "non_persistent_save_interval": 1, "local": True}
    results = run_ranks(2, _train_then_resume, tmp_path, kw, 1, 1, store_dir=tmp_path)
    assert [r["loaded"] for r in results] == [4, 4]
    assert not any(r["same"] for r in results)  # step 5's weights are gone with the node


class DyingWriter(FileSystemWriter):
    """DCP's file writer that SIGKILLs its own process once its data is on disk, at the
    save of step ``die_at`` (before the metadata and the commit)."""

    def __init__(self, path: Path, die: bool) -> None:
        super().__init__(path)
        self.die = die

    def write_data(self, plan: Any, planner: Any) -> Any:
        result = super().write_data(plan, planner)
        if self.die:
            result.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def _killed_mid_save(rank: int, world: int, root: Path) -> None:
    model, opt, data = _trainer(rank)
    config = _config(root, rank, 1, dist_timeout_s=5)
    m = CheckpointManager(
        config,
        {"model": model, "optim": opt},
        job_id="job",
        session=False,
        writer_factory=lambda p: DyingWriter(
            p, die=rank == 1 and p.name.startswith(".tmp_step_000000002")
        ),
    )
    _step(model, opt, data, rank)
    m.save(1)
    _step(model, opt, data, rank)
    m.save(2)


def _resume_only(rank: int, world: int, root: Path) -> int | None:
    model, opt, _ = _trainer(rank, seed=3)
    config = _config(root, rank, 1)
    m = CheckpointManager(config, {"model": model, "optim": opt}, job_id="job", session=False)
    step = m.load_latest()
    m.close()
    return step


def test_a_rank_killed_during_a_save_never_leaves_a_checkpoint_that_loads(
    tmp_path: Path,
) -> None:
    with pytest.raises((RuntimeError, AssertionError, TimeoutError)):
        run_ranks(2, _killed_mid_save, tmp_path, store_dir=tmp_path, timeout_s=40, pg_timeout_s=5)
    root = tmp_path / "persistent"
    assert not (root / "step_000000002" / COMMIT_MARKER).exists()
    assert run_ranks(2, _resume_only, tmp_path, store_dir=tmp_path) == [1, 1]
    # the new job's manager cleared the dead writer's temporary directory
    assert not [p for p in os.listdir(root) if p.startswith(".tmp_")]


def _fsdp_save(rank: int, world: int, root: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    config = CheckpointConfig(save=str(root / "persistent"), async_save=True)
    m = CheckpointManager(config, {"model": model, "optim": opt}, job_id="job", session=False)
    m.save(1)
    opt.step()  # waits for the background copy of the shards it changes
    m.close()
    m2 = CheckpointManager(config, {"model": model, "optim": opt}, job_id="job", session=False)
    assert m2.load_latest() == 1  # back to the saved shards
    m2.close()
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def _plain_load(rank: int, world: int, root: Path) -> tuple[int | None, dict[str, Any]]:
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    config = CheckpointConfig(save=str(root / "persistent"))
    m = CheckpointManager(config, {"model": model, "optim": opt}, job_id="job", session=False)
    step = m.load_latest()
    m.close()
    return step, {k: v.clone() for k, v in model.state_dict().items()}


def test_an_fsdp2_checkpoint_of_2_ranks_loads_resharded_into_1_rank(tmp_path: Path) -> None:
    saved = run_ranks(2, _fsdp_save, tmp_path, store_dir=tmp_path)
    ((step, loaded),) = run_ranks(1, _plain_load, tmp_path, store_dir=tmp_path)
    assert step == 1
    for key, value in loaded.items():
        assert torch.equal(value, saved[0][key]), key
