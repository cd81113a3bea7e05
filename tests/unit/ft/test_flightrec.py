"""The flight recorder on a hang: two gloo ranks where one skips an all-reduce, their
traces taken through the request file by each rank's dumper thread, and the verdict."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rankguard.ft.flightrec import (
    FrVerdict,
    TraceDumper,
    analyse,
    available,
    flight_recorder_env,
    request_dumps,
    trace_file,
)

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]


def test_env_turns_the_recorder_on_and_keeps_the_users_settings(tmp_path: Path) -> None:
    env = flight_recorder_env(tmp_path, {}, torch_version="2.13.0+cpu")
    assert env == {  # torch 2.9 and later: the new names only (the old ones warn)
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "flightrec" / "rank_"),
    }
    older = flight_recorder_env(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"})
    assert older["TORCH_FR_BUFFER_SIZE"] == "500"  # the user's size, under the read name
    assert flight_recorder_env(tmp_path, {"TORCH_FR_BUFFER_SIZE": "0"}) == {}
    mine = flight_recorder_env(tmp_path, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/fr_"})
    assert mine["TORCH_FR_DUMP_TEMP_FILE"] == "/x/fr_"
    old = flight_recorder_env(tmp_path, {"TORCH_FR_BUFFER_SIZE": "64"}, torch_version="2.8.1")
    assert old["TORCH_FR_BUFFER_SIZE"] == old["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64"
    assert old["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == old["TORCH_FR_DUMP_TEMP_FILE"]


def test_the_ranks_of_this_torch_start_without_a_warning_about_the_names(
    tmp_path: Path,
) -> None:
    env = {**os.environ, **flight_recorder_env(tmp_path, os.environ)}
    code = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0,"
        " world_size=1)\n"
        "import torch; t = torch.ones(1); dist.all_reduce(t)\n"
        "dist.destroy_process_group()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Environment variable TORCH_" not in res.stderr, res.stderr[-2000:]


def _trace(enqueued: int, completed: int, entries: list[tuple[int, str]]) -> dict[str, Any]:
    return {
        "version": "2.10",
        "pg_status": {
            "0": {"last_enqueued_collective": enqueued, "last_completed_collective": completed}
        },
        "entries": [
            {"process_group": ("0", "default_pg"), "collective_seq_id": s, "profiling_name": n}
            for s, n in entries
        ],
    }


def test_verdict_from_recorded_traces(tmp_path: Path) -> None:
    d = tmp_path / "flightrec"
    d.mkdir()
    ops = [(1, "nccl:all_reduce"), (2, "nccl:all_reduce"), (3, "nccl:all_gather")]
    for rank in range(4):
        behind = rank == 2
        doc = _trace(2 if behind else 3, 2, ops[:2] if behind else ops)
        trace_file(tmp_path, rank).write_text(json.dumps(doc))
    (d / "rank_x.json").write_bytes(b"not a trace")
    v = analyse(d, [0, 1, 2, 3], run_torch=False)
    assert v is not None
    assert (v.process_group, v.collective, v.seq) == ("0", "all_gather", 3)
    assert v.missing_ranks == [2] and v.waiting_ranks == [0, 1, 3]
    assert v.ranks_read == [0, 1, 2, 3]
    assert v.line == (
        "flight recorder: rank(s) 2 did not join all_gather #3 of process group 0 "
        "(rank(s) 0, 1, 3 wait in it)"
    )
    assert FrVerdict.from_dict(v.to_dict()) == v
    with pytest.raises(ValueError, match="missing_ranks"):
        FrVerdict.from_dict({**v.to_dict(), "missing_ranks": ["2"]})


def test_no_verdict_when_every_rank_agrees_or_nothing_was_read(tmp_path: Path) -> None:
    d = tmp_path / "flightrec"
    assert analyse(d, [0, 1], run_torch=False) is None
    d.mkdir()
    for rank in range(2):
        doc = _trace(3, 3, [(3, "gloo:all_reduce")])
        trace_file(tmp_path, rank).write_text(json.dumps(doc))
    assert analyse(d, [0, 1], run_torch=False) is None


# ---- two gloo ranks, one skips an all-reduce ----------------------------------------


def _rank(rank: int, run_dir: str, store: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    dumper = TraceDumper(Path(run_dir), rank, poll_s=0.05)
    dumper._thread.start()
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    Path(run_dir, f"ready_{rank}").write_text("")
    if rank == 0:
        dist.all_reduce(t)  # rank 1 never joins: blocks here until killed
    else:
        time.sleep(60)  # alive, not in the collective


@pytest.mark.skipif(not available(), reason="this torch has no flight recorder")
def test_a_rank_that_skips_an_all_reduce_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in flight_recorder_env(tmp_path, {}).items():
        monkeypatch.setenv(name, value)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank, args=(r, str(tmp_path), str(tmp_path / "store")))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready_{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "the ranks did not start"
            assert all(p.is_alive() for p in procs)
            time.sleep(0.1)
        time.sleep(0.5)  # rank 0 is inside its fourth all-reduce
        got = request_dumps(tmp_path, [0, 1], timeout_s=20)
        assert set(got) == {0, 1} and got[1] == trace_file(tmp_path, 1)
        verdict = analyse(tmp_path / "flightrec", [0, 1], timeout_s=60)
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    assert verdict is not None
    assert verdict.missing_ranks == [1] and verdict.waiting_ranks == [0]
    assert (verdict.collective, verdict.seq) == ("all_reduce", 4)
    assert verdict.torch_analysis  # torchfrtrace's output or why it could not match gloo
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "2000"
