"""End to end: ``rankguard run`` given what torchrun's users give torchrun.

Each run checks that every global rank ran (a file per rank, written by the rank after
an all-reduce over all of them) and several torchrun features at once, to keep the
number of runs small.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    fast_sets,
    free_port,
    heartbeat_files,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_nodes,
    run_rankguard,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

SCRIPT = SCRIPTS / "torchrun_env.py"


def ranks(out: Path, world: int) -> dict[int, dict]:
    found = {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in out.glob("rank_*.json")}
    assert sorted(found) == list(range(world)), sorted(found)
    return found


def _console(res: subprocess.CompletedProcess[str]) -> str:
    return res.stdout + res.stderr


def test_four_spawned_ranks_with_torchruns_logs_prefix_and_failure_summary(
    tmp_path: Path, run_id: str
) -> None:
    out, torch_logs, rg = tmp_path / "out", tmp_path / "torchlogs", tmp_path / "rg"
    env = {**os.environ, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}-${rank}]:"}
    env.pop("OMP_NUM_THREADS", None)
    res = subprocess.run(
        rankguard_cmd(
            "run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "--start-method=spawn",
            "--role",
            "worker",
            "--redirects",
            "3",
            "--tee",
            "3",
            "--log-dir",
            str(torch_logs),
            "--rdzv-id",
            run_id,
            "--set",
            f"log_dir={rg}",
            *fast_sets(),
            str(SCRIPT),
            "--out",
            str(out),
            "--fail-rank",
            "3",
        ),
        capture_output=True,
        text=True,
        timeout=140,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    console = _console(res)
    assert res.returncode == 1, console
    seen = ranks(out, 4)
    for rank, rec in seen.items():
        assert rec["RANK"] == str(rank) and rec["LOCAL_RANK"] == str(rank)
        assert rec["ROLE_RANK"] == str(rank) and rec["GROUP_RANK"] == "0"
        assert rec["ROLE_NAME"] == "worker"
        assert rec["WORLD_SIZE"] == rec["ROLE_WORLD_SIZE"] == rec["LOCAL_WORLD_SIZE"] == "4"
        assert rec["MASTER_ADDR"] == "127.0.0.1" and int(rec["MASTER_PORT"]) > 0
        assert rec["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert rec["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert rec["TORCHELASTIC_RUN_ID"] == run_id
        assert rec["TORCHELASTIC_ERROR_FILE"].startswith(str(torch_logs))
        assert rec["OMP_NUM_THREADS"] == "1"  # torchrun's rule for several ranks
        assert rec["is_torchelastic_launched"] is True and rec["all_reduce"] == 4.0
        # tee: on the console with torch's prefix, and in torchrun's per-rank files
        assert f"[worker-{rank}]:hello-stdout from rank {rank}" in console, console
        assert f"[worker-{rank}]:hello-stderr from rank {rank}" in console, console
    attempt = next(torch_logs.glob(f"{run_id}_*/attempt_0"))
    for local in range(4):
        assert (
            f"hello-stdout from rank {local}" in (attempt / str(local) / "stdout.log").read_text()
        )
    # torchrun's failure summary: the root cause and its error file
    assert "root cause: rank 3" in console and "fails on purpose" in console, console
    assert f"error file: {attempt / '3' / 'error.json'}" in console, console
    run_dir = rg / "heartbeat" / run_id
    assert run_dir.is_dir() and not (torch_logs / "heartbeat").exists()
    shown = run_rankguard(["logs", str(run_dir), "--rank", "2"], timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "hello-stdout from rank 2" in shown.stdout
    assert "hello-stderr from rank 2" in shown.stdout
    assert "rank 1" not in shown.stdout
    assert no_leftover_workers(run_id)


def test_no_python_bash_ranks_with_an_elastic_node_range_and_one_agent(
    tmp_path: Path, run_id: str
) -> None:
    out, rg = tmp_path / "out", tmp_path / "rg"
    script = tmp_path / "rank.sh"
    script.write_text(
        '#!/bin/bash\nmkdir -p "$1"\n'
        'echo "{\\"WORLD_SIZE\\": \\"$WORLD_SIZE\\", \\"GROUP_RANK\\": \\"$GROUP_RANK\\"}" '
        '> "$1/rank_$RANK.json"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    res = run_rankguard(
        [
            "run",
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            "last_call_timeout=1",
            "--no-python",
            "--set",
            f"log_dir={rg}",
            str(script),
            str(out),
        ],
        timeout=140,
    )
    console = _console(res)
    assert res.returncode == 0, console
    seen = ranks(out, 2)
    assert all(r == {"WORLD_SIZE": "2", "GROUP_RANK": "0"} for r in seen.values()), seen
    assert "--no-python: the ranks start without rankguard's bootstrap" in console
    assert "[rankguard] monitoring: heartbeats OFF" in console


def test_two_nodes_on_torchruns_static_rendezvous_one_from_pet_variables_only(
    tmp_path: Path, run_id: str
) -> None:
    # torchrun's default backend with a master address and port (what a Kubeflow
    # PyTorchJob gives): the node ranks are the given ones, node 0 hosts the store, and
    # node 1's heartbeats reach node 0's monitor through the store the static handler
    # hands out. Node 0 is launched as a PyTorchJob launches it: PET_* variables only
    # (--nproc-per-node auto: as many ranks as its CPUs, one here; --run-path; the fork
    # start method; the config file), node 1 with torchrun's flags and --rank-prefix (the
    # node and global rank before each line of a rank). rankguard's default timeouts (a
    # loaded machine's slow steps are no fault): no finding. The ranks' process group
    # from tcp://MASTER_ADDR:MASTER_PORT, the store the launcher provides.
    port = free_port()
    out = tmp_path / "out"
    logs = {n: tmp_path / f"node{n}" for n in (0, 1)}
    cfg = tmp_path / "rankguard.yaml"
    cfg.write_text(
        f"log_dir: {logs[0]}\nheartbeat:\n  publish_interval_s: 0.5\n  scan_interval_s: 0.5\n"
    )
    script_args = ("--out", str(out), "--init", "tcp")
    cmds = {
        0: rankguard_cmd("run", str(SCRIPT), *script_args),
        1: rankguard_cmd(
            "run",
            "--rank-prefix",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--rdzv-id",
            run_id,
            "--set",
            f"log_dir={logs[1]}",
            "--set",
            "heartbeat.publish_interval_s=0.5",
            "--set",
            "heartbeat.scan_interval_s=0.5",
            str(SCRIPT),
            *script_args,
        ),
    }
    pet = {
        "PET_NPROC_PER_NODE": "auto",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "PET_RDZV_ID": run_id,
        "PET_RUN_PATH": "1",
        "PET_START_METHOD": "fork",
        "PET_CONFIG": str(cfg),
    }
    one_cpu = sorted(os.sched_getaffinity(0))[:1]
    outs, codes = run_nodes(cmds, timeout_s=130, envs={0: pet}, cpus={0: one_cpu})
    both = "\n".join(f"--- node {n}\n{o}" for n, o in outs.items())
    assert codes == {0: 0, 1: 0}, both
    seen = ranks(out, 2)
    for rank, rec in seen.items():
        assert rec["WORLD_SIZE"] == "2" and rec["MASTER_PORT"] == str(port), rec
        assert rec["GROUP_RANK"] == str(rank) and rec["argv"] == list(script_args), rec
    run0 = logs[0] / "heartbeat" / run_id
    assert len(heartbeat_files(logs[1] / "heartbeat" / run_id)) == 1
    assert len(heartbeat_files(run0)) == 2  # node 1's rank mirrored on node 0
    status = read_status(run0)
    assert sorted((r["rank"], r["node_rank"]) for r in status["ranks"]) == [(0, 0), (1, 1)]
    assert read_jsonl(run0 / "findings.jsonl") == [], both
    first = next(ln for ln in outs[0].splitlines() if ln.startswith("[rankguard]"))
    assert first.startswith("[rankguard] monitoring: heartbeats on (process timeout 30 s"), both
    assert "rendezvous static" in first, both
    assert "[node1 rank1]: hello-stdout from rank 1" in outs[1], both
    shown = run_rankguard(
        ["logs", str(logs[1] / "heartbeat" / run_id), "--rank", "1", "--stream", "stderr"]
    )
    assert shown.returncode == 0, shown.stderr
    assert "hello-stderr from rank 1" in shown.stdout, shown.stdout
