"""End to end: live recovery of FSDP2 state under the real ``rankguard run --preload
torch`` (2 CPU ranks on gloo, 1 standby, ``tests/e2e/scripts/fsdp_live.py``): rank 1 is
SIGKILLed after step 2; the standby takes it, every rank loads local checkpoint step 2
(the newcomer's shard from the lost process's files on this node's disk) and the job
ends without a group restart, every step's loss and each rank's random draw those of an
uninterrupted run (computed here in one process). The replica path and the fallbacks
are tested in ``tests/tier2/test_live_sharded_tier2.py``; this test is what those cannot
show: the real command line, its agent, restarts.jsonl, status.json, ``rankguard
status`` and the console, each saying where the newcomer's state came from. Three
steps: one before the kill's step, the kill's, one the newcomer trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from .conftest import no_leftover_workers, read_jsonl, run_rankguard, standalone_run
from .test_live_recovery_e2e import LIVE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_live.py"
STEPS, BATCH, KILL = 3, 8, 2  # rank 1 killed after step KILL


def _reference() -> list[float]:
    """The script's job uninterrupted, in one process: the whole batch per step."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    out = []
    for step in range(1, STEPS + 1):
        x = torch.randn(BATCH, 8, generator=torch.Generator().manual_seed(1000 + step))
        y = torch.tanh(x[:, :1] - x[:, 1:2]) + 0.5
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_a_lost_fsdp2_rank_continues_from_the_local_checkpoint(tmp_path: Path, run_id: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=2),
            "--preload",
            "torch",
            "--standby-ranks",
            "1",
            "--max-restarts",
            "1",
            *LIVE,
            str(SCRIPT),
            *("--steps", str(STEPS), "--kill-at", f"1:{KILL}"),
            *("--out", str(out), "--local-dir", str(tmp_path / "local")),
        ],
        timeout=280,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-4000:]
    lines = read_jsonl(tmp_path / "heartbeat" / run_id / "restarts.jsonl")
    assert [line["kind"] for line in lines] == ["live_recovery"], lines
    (entry,) = lines
    assert entry["lost_rank"] == 1 and entry["exit"] == "SIGKILL"
    assert entry["source"] == f"local checkpoint step {KILL}: rank 1's own local directory"
    assert entry["steps_redone"] == 0 and entry["resumed_step"] == KILL + 1
    assert (
        f"live recovery: sharded state from local checkpoint step {KILL} (rank 1's shard from "
        "its own local directory (the lost process's files, on this node's disk)); every rank "
        f"continues after step {KILL}, 0 step(s) redone"
    ) in text
    recs = {  # pid -> its records
        f.stem: [json.loads(x) for x in f.read_text().splitlines()] for f in out.glob("*.jsonl")
    }
    assert len(recs) == 3, recs  # rank 0 kept its process; rank 1's, then the standby's
    assert str(entry["standby_pid"]) in recs and str(entry["lost_pid"]) in recs
    assert [r["step"] for r in recs[str(entry["standby_pid"])]] == list(range(KILL + 1, STEPS + 1))
    ref = _reference()
    for rank in (0, 1):  # each rank's own stream, set once per process, restored
        torch.manual_seed(100 + rank)
        draws = [torch.rand(1).item() for _ in range(STEPS)]
        mine = [r for rs in recs.values() for r in rs if r["rank"] == rank]
        assert sorted(r["step"] for r in mine) == list(range(1, STEPS + 1))
        for r in mine:
            assert r["loss"] == pytest.approx(ref[r["step"] - 1], rel=1e-5), r
            assert r["draw"] == draws[r["step"] - 1], r
    assert "the worker group restarts" not in text
    # where the newcomer's state came from, wherever the recovery is said: the
    # launcher's console line, status.json's live block and rankguard status
    assert (
        f"live recovery 1: rank 1 now standby pid {entry['standby_pid']} (rank_process_exited); "
        "fault -> next step "
    ) in text
    assert f"0 step(s) redone; state from {entry['source']}\n" in text
    run_dir = tmp_path / "heartbeat" / run_id
    status = json.loads((run_dir / "status.json").read_text())
    assert [r["source"] for r in status["live"]["replaced"]] == [entry["source"]], status["live"]
    shown = run_rankguard(["status", str(run_dir)], timeout=60).stdout
    assert (
        f"  rank 1: pid {entry['lost_pid']} lost (rank_process_exited), now standby pid "
        f"{entry['standby_pid']}, state from {entry['source']}"
    ) in shown, shown
    assert no_leftover_workers(run_id)
