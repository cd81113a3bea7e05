"""Ranks as processes on gloo: the decision after each attempt is the same on every rank.

A NaN on one rank makes both ranks re-run the same iteration (with their own same
batches); a transient fault on one rank lets both go on; a persistent one makes both
save and exit 16, and after the resume both exit 17.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]


def _rank_main(rank: int, world: int, tmp: str, scenario: str, resume: bool) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked rank must not enter the parent's OpenMP pool

    from rankguard.rerun import RerunStateMachine, RerunStateMachineConfig
    from tests.factories import RerunExit, TorchSaver, raising_exit

    real_all_reduce = dist.all_reduce
    store = f"file://{tmp}/store_{'resume' if resume else 'first'}"
    dist.init_process_group(
        "gloo", init_method=store, rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    cfg: dict[str, Any] = {"rerun_mode": "validate_results"}
    if scenario.startswith("inject-"):
        cfg |= {"error_injection_rate": 1, "error_injection_type": scenario[7:]}
    saver = TorchSaver(Path(tmp) / "ckpt", lambda: {"w": torch.zeros(1)}, rank=rank)
    piggyback = scenario == "nan-grad-norm"
    m = RerunStateMachine(
        RerunStateMachineConfig(**cfg),
        checkpoint=saver,
        state_dir=Path(tmp) / "ckpt",
        exit=raising_exit,
        agreement="grad_norm" if piggyback else "all_reduce",
    )
    ours = []  # the machine's own collectives in the piggy-backed mode: none per step
    if piggyback:
        real = dist.all_reduce

        def counting(*a: Any, **kw: Any) -> Any:
            ours.append(1)
            return real(*a, **kw)

        m_dist = __import__("rankguard.rerun.agreement", fromlist=["dist"]).dist
        m_dist.all_reduce = counting
    torch.manual_seed(rank)
    batches = m.replay(iter(range(100 * rank, 100 * rank + 100)))
    seen: list[list[Any]] = []
    code = 0
    first = 3 if resume else 1
    if resume:
        for _ in range(first - 1):  # the resumed pipeline starts at the saved iteration
            next(batches)
    try:
        for step in range(first, 6):
            for attempt, _ in enumerate(m.iteration(step, batches)):
                batch = next(batches)
                loss = torch.tensor(float(batch)) + torch.rand(())
                nan = scenario.startswith("nan") and (step, attempt, rank) == (3, 0, 1)
                nan |= scenario == "bad-gpu" and step == 3 and rank == 1 and not resume
                if nan:
                    loss = loss * math.nan
                loss = m.validate_loss(loss)
                # the gradients' all-reduce a DDP backward does, on both attempts
                grad = loss.detach().clone()
                real_all_reduce(grad)
                m.agree_on(grad)  # the total gradient norm (ignored by all_reduce mode)
                seen.append([step, attempt, batch])
            if scenario.startswith("inject-"):
                m.config.error_injection_rate = 0  # one injection per run is enough here
                m.injector.rate = 0
    except RerunExit as exc:
        code = exc.code
    result = {
        "ours": len(ours),
        "seen": seen,
        "code": code,
        "events": [[e.outcome.value, e.iteration] for e in m.events],
        "saved": saver.saved,
        "faulty": [[e.faulty_hostname, e.faulty_gpu] for e in m.events if e.faulty_hostname],
    }
    name = f"rank{rank}_{'resume' if resume else 'first'}.json"
    Path(tmp, name).write_text(json.dumps(result))
    dist.destroy_process_group()


def _run(tmp: Path, scenario: str, *, resume: bool = False) -> list[dict[str, Any]]:
    ctx = mp.get_context("fork")  # torch is imported here: the ranks start at once
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, str(tmp), scenario, resume)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0, f"rank process exited with {p.exitcode}"
    name = "resume" if resume else "first"
    return [json.loads((tmp / f"rank{r}_{name}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("scenario", ["nan", "nan-grad-norm"])
def test_nan_on_one_rank_makes_every_rank_rerun_the_same_iteration(
    tmp_path: Path, scenario: str
) -> None:
    r0, r1 = _run(tmp_path, scenario)
    for r, out in ((0, r0), (1, r1)):
        steps = [s for s, attempt, _ in out["seen"] if attempt == 1]
        assert steps == [3], f"rank {r} re-ran {steps}"
        batches = [b for s, _, b in out["seen"] if s == 3]
        assert batches[0] == batches[1] == 100 * r + 2  # its own batch, replayed
        assert out["code"] == 0
    assert r1["events"] == [["transient_fault", 3]] and r0["events"] == []
    if scenario == "nan-grad-norm":
        # none per step (5 steps): one at the start (do the ranks agree on a saved re-run)
        # and one for the verdict of the rare re-run in place
        assert r0["ours"] == r1["ours"] == 2


def test_persistent_fault_on_one_rank_then_exit_17_after_resume(tmp_path: Path) -> None:
    r0, r1 = _run(tmp_path, "bad-gpu")
    assert r0["code"] == r1["code"] == 16
    assert r0["saved"] == r1["saved"] == [2]  # the state before iteration 3
    assert r1["events"] == [["persistent_fault", 3]] and r0["events"] == []
    r0, r1 = _run(tmp_path, "bad-gpu", resume=True)
    assert r0["code"] == r1["code"] == 17
    assert r1["events"] == [["validation_failed", 3]] and r0["events"] == []
    assert [b for s, _, b in r1["seen"]] == [102]  # the first run's batch of iteration 3
    assert r1["faulty"] == [[socket.gethostname(), "cpu"]]  # the first run's host and GPU


@pytest.mark.parametrize(
    ("kind", "first_code", "outcome"),
    [("transient_error", 0, "transient_fault"), ("persistent_error", 16, "persistent_fault")],
)
def test_injected_errors_agree(tmp_path: Path, kind: str, first_code: int, outcome: str) -> None:
    r0, r1 = _run(tmp_path, f"inject-{kind}")
    assert r0["code"] == r1["code"] == first_code
    for out in (r0, r1):  # both ranks injected at iteration 1 (rate 1): both re-ran it
        assert [s for s, attempt, _ in out["seen"] if attempt == 1] == [1]
        assert out["events"] == [[outcome, 1]]
