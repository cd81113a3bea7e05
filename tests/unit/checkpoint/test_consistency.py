"""An async checkpoint of step N is the state at the ``save(N)`` call, bit for bit, on
every tier (persistent, local, a local replica) and writer (DCP's thread or process),
with 1 rank (DCP's thread) and 2 ranks (either writer): right after ``save`` returns
the loop changes everything in place (writes to parameters seen by their version
counter and writes through ``.data`` and a NumPy view that are not, buffers, optimizer
moments and hyper-parameters, a forward with BatchNorm, an optimizer and scheduler
step, the RNG streams, the data position, a stateful object's nested containers); the
checkpoint loaded into a fresh copy equals a deep copy taken at the call, item by
item."""

from __future__ import annotations

import copy
import multiprocessing
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from rankguard.checkpoint import CheckpointConfig, CheckpointManager, DataPosition, RNGState
from tests.factories import run_ranks

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """The 2048-wide matmuls here run on one thread: a parent process that ran an
    OpenMP parallel region hangs the forked ranks of later tests in their first one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Net(torch.nn.Module):
    """Linear layers (17 MB of weights: a copy that takes a while), BatchNorm
    (statistics change in every forward) and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 2048)
        )
        self.head = torch.nn.Linear(2048, 2048)
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Bag:
    """Stateful object whose ``state_dict`` returns its live nested containers."""

    def __init__(self) -> None:
        self.d: dict[str, Any] = {"seen": [1, 2], "meta": {"k": "v"}}

    def state_dict(self) -> dict[str, Any]:
        return self.d

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.d = copy.deepcopy(state_dict)


class Trainer:
    def __init__(self, seed: int, ddp: bool) -> None:
        torch.manual_seed(seed)
        net = Net()
        self.model: torch.nn.Module = DDP(net) if ddp else net
        self.net = net
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)
        self.data = DataPosition(extra={"order": [3, 1]})
        self.bag = Bag()

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "optim": self.opt,
            "sched": self.sched,
            "data": self.data,
            "bag": self.bag,
            "rng": RNGState(),
        }

    def step(self) -> None:
        self.model(torch.randn(8, 16)).pow(2).mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        self.data.index += 1

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of every item a checkpoint holds."""
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optim": self.opt.state_dict(),
                "sched": self.sched.state_dict(),
                "data": self.data.state_dict(),
                "bag": self.bag.state_dict(),
                "rng": RNGState().state_dict(),
            }
        )

    def mutate(self) -> None:
        """Every kind of in-place change a loop makes after a save returns."""
        params = list(self.net.parameters())
        with torch.no_grad():
            for p in params:  # EMA, clipping, weight averaging: seen by p._version
                p.add_(1.0)
        for p in params:  # param.data.copy_: not seen by p._version
            p.data.copy_(p.data * 0.5 - 0.25)
        params[0].detach().numpy()[...] += 3.0  # a NumPy view: not seen either
        for b in self.net.buffers():
            b.add_(1)
        for st in self.opt.state.values():
            st["exp_avg"].mul_(-1.0)
            st["exp_avg_sq"].add_(1.0)
        self.opt.param_groups[0]["lr"] = 123.0
        self.step()  # BatchNorm statistics, optimizer, scheduler, data position
        torch.rand(7)
        random.random()
        np.random.rand(3)
        self.data.extra["order"].append(99)
        self.bag.d["seen"].append(3)
        self.bag.d["meta"]["k"] = "changed"


def diff(a: Any, b: Any, where: str = "") -> list[str]:
    """The paths where ``a`` and ``b`` differ (tensors and arrays bit for bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
        return [] if ok else [where]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where} keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [d for k in a for d in diff(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where} length {len(a)} != {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in diff(x, y, f"{where}.{i}")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _config(root: Path, rank: int, tier: str, writer: str) -> CheckpointConfig:
    if tier == "persistent":
        return CheckpointConfig(
            save=str(root / "persistent"), async_save=True, async_checkpointer_type=writer
        )
    return CheckpointConfig(
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(root / f"node{rank}"),
        async_save=True,
        async_checkpointer_type=writer,
        replication=tier == "replica",
        replication_jump=1 if tier == "replica" else None,
    )


def save_mutate_load(root: Path, rank: int, world: int, tier: str, writer: str) -> list[str]:
    """Save step 1, change everything at once, wait; load into a fresh trainer (rank 1
    from rank 0's replica for ``replica``): what differs from the copy at the call."""
    ddp = dist.is_initialized()
    config = _config(root, rank, tier, writer)
    t = Trainer(seed=0, ddp=ddp)
    t.step()
    m = CheckpointManager(config, t.state(), job_id="j", local_world_size=1, session=False)
    expected = t.snapshot()
    m.save(1, tier="persistent" if tier == "persistent" else "local")
    t.mutate()
    m.close()
    assert m.last_committed["persistent" if tier == "persistent" else "local"] == 1
    if tier == "replica":
        dist.barrier()
        if rank == 1:
            shutil.rmtree(root / "node1")
        dist.barrier()
    fresh = Trainer(seed=1, ddp=ddp)
    fresh.step()
    fresh.mutate()  # nothing of it may survive the load
    with CheckpointManager(
        config, fresh.state(), job_id="j", local_world_size=1, session=False
    ) as m2:
        assert m2.load_latest() == 1
    return diff(fresh.snapshot(), expected)


def _rank(rank: int, world: int, root: Path, tier: str, writer: str) -> list[str]:
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    if writer == "process":  # DCP's checkpoint process is the rank's child, as under a launcher
        multiprocessing.current_process().daemon = False
    return save_mutate_load(root, rank, world, tier, writer)


@pytest.mark.parametrize("tier", ["persistent", "local"])
def test_one_rank_thread_writer_saves_the_state_at_the_call(tmp_path: Path, tier: str) -> None:
    assert save_mutate_load(tmp_path, 0, 1, tier, "thread") == []


# The local tier on 2 ranks: ``replica``'s rank 0 loads its own local directory (rank 1
# the replica of its shard on rank 0's node).
@pytest.mark.parametrize(
    ("world", "tier", "writer"),
    [
        (2, "persistent", "thread"),
        (2, "persistent", "process"),
        (2, "replica", "thread"),
    ],
)
def test_ranks_on_gloo_save_the_state_at_the_call(
    tmp_path: Path, world: int, tier: str, writer: str
) -> None:
    results = run_ranks(
        world, _rank, tmp_path, tier, writer, store_dir=tmp_path, timeout_s=100, pg_timeout_s=30
    )
    assert results == [[]] * world


def test_the_loop_writes_right_after_save_returns_are_really_there(tmp_path: Path) -> None:
    """The changes the tests above make are real: each kind alters what a checkpoint
    holds, and the writes through ``.data`` and a NumPy view leave the version counter
    of the parameter as it was (so no version check could see them)."""
    t = Trainer(seed=0, ddp=False)
    t.step()
    before = t.snapshot()
    p = t.net.head.weight
    version = p._version
    p.data.copy_(p.data + 1.0)
    p.detach().numpy()[...] += 1.0
    assert p._version == version
    t.mutate()
    changed = {d.split(".")[1] for d in diff(t.snapshot(), before)}
    assert {"model", "optim", "sched", "data", "bag", "rng"} <= changed


def test_stage_in_background_has_no_effect_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = Trainer(seed=0, ddp=False)
    config = CheckpointConfig(save=str(tmp_path / "c"), async_save=True, stage_in_background=True)
    with CheckpointManager(config, t.state(), job_id="j", session=False):
        pass
    lines = [line for line in capsys.readouterr().err.splitlines() if "stage_in_background" in line]
    assert len(lines) == 1 and "has NO effect" in lines[0], lines
    assert CheckpointConfig(save="x", async_save=True).warnings() == []
