"""The rerun state machine with real sessions: ranks as processes (``run_ranks``: the
machine agrees on torch's default process group), node 0's real services in the test
process reading their heartbeats. A NaN once on rank 1 is a transient fault: both ranks
re-run that iteration once, node 0 writes one ``rerun_transient_fault`` finding naming
rank 1 and the iteration, and the final status counts the re-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from rankguard.launcher.services import NodeServices
from tests.factories import STORE_CONNECT_TIMEOUT, read_jsonl, run_ranks
from tests.harness import ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]

VALIDATE = (
    "rerun_state_machine.rerun_mode=validate_results",
    "rerun_state_machine.check_for_spiky_loss=true",
    "rerun_state_machine.spiky_loss_warmup=2",
)


def _train(rank: int, world: int, env: dict[str, str], steps: int, nan_at: int) -> int:
    """A data-parallel loop through the run's rerun state machine; rank 1's loss is NaN
    at ``nan_at`` on the first try only. Returns this rank's re-runs."""
    import torch
    import torch.distributed as dist

    from rankguard.bootstrap import session_from_env
    from rankguard.rank.runenv import RunEnv
    from rankguard.session import Session

    torch.set_num_threads(1)
    session = session_from_env(RunEnv.from_environ(env))
    assert isinstance(session, Session)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    rerun = session.rerun()  # torch's default group: the one run_ranks made
    batches = rerun.replay(iter(lambda: torch.randn(8, 4, generator=gen), None))
    for step in range(1, steps + 1):
        for _ in rerun.iteration(step, batches):
            loss = model(next(batches)).pow(2).mean()
            if rank == 1 and step == nan_at and not rerun.rerunning:
                loss = loss * float("nan")
            rerun.validate_loss(loss)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
        if rerun.accepted:
            opt.step()
        session.step_end(step)
    session.close(clean=True, exit_code=0)
    return rerun.reruns


def test_nan_once_on_one_rank_is_a_transient_fault(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path / "logs", 2, sets=VALIDATE)
    job.run_dir.mkdir(parents=True)
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_CONNECT_TIMEOUT
    )
    services = NodeServices(job.cfg, job.run_dir, job.run_id, 0, 1, 2)
    services.start()
    try:
        envs = [job.environ(rank, master.port) for rank in range(2)]
        reruns = run_ranks(2, _train_env, envs, 6, 3, store_dir=tmp_path)
    finally:
        status = services.stop()
    assert reruns == [1, 1]
    found = read_jsonl(job.run_dir / "findings.jsonl")
    rerun = [
        (f["finding_type"], f["rank"], f["iteration"])
        for f in found
        if f["finding_type"].startswith("rerun_")
    ]
    assert rerun == [("rerun_transient_fault", 1, 3)], found
    # both ranks re-ran iteration 3 (rank 0's loss was fine): one re-run each, no other
    for rank in range(2):
        (path,) = job.run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl")
        last = read_jsonl(path)[-1]
        assert last["rerun"]["reruns"] == 1, (rank, last["rerun"])
    assert status is not None
    assert status["state"] == "completed" and status["rerun"]["reruns"] == 1, status


def _train_env(rank: int, world: int, envs: list[dict[str, str]], steps: int, nan_at: int) -> Any:
    return _train(rank, world, envs[rank], steps, nan_at)
