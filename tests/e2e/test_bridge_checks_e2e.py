"""End to end: Megatron Bridge's resiliency verification steps under ``rankguard run``
with Bridge's config (tests/fixtures/megatron_bridge_config.yaml) and a script that uses
NVRx's client as Bridge's fault tolerance does (2 CPU ranks, gloo). Bridge's checks grep
the logs for ``[FaultTolerance]`` / ``[RankMonitorServer]`` lines with the section
timeouts, ``GPU relative performance`` and ``GPU individual performance`` reports with
per-rank scores and ``Scheduling async checkpoint save``: all found, beside rankguard's
own lines. The config turns preemption, rerun and in-process restart on for a script
that takes none of them up: each said once.
NVRx's ``ft_state.json`` and rankguard's own state sit in ``checkpoint.save``.

The script's client is NVRx 0.7.0's own (tests/nvrx_release.py, the release's files
first on the ranks' ``PYTHONPATH``; the installed 0.4 when its wheel cannot be
fetched): served, no finding when healthy, and 0.7's init message (its warm-up count)
reached rankguard's server. The installed client's hang, restart and exit code:
``test_nvrx_client_e2e.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.nvrx_release import VERSION, fetch, release_env

from .conftest import (
    SCRIPTS,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    standalone_run,
)

pytest.importorskip("nvidia_resiliency_ext.fault_tolerance")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_bridge_verification_lines_are_found(tmp_path: Path, run_id: str) -> None:
    save = tmp_path / "save"
    release, _why = fetch()  # NVRx 0.7.0's client (else the installed one, 0.4)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if release is not None:
        env = release_env(release, env)
    res = subprocess.run(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "--config",
            str(FIXTURES / "megatron_bridge_config.yaml"),
            f"checkpoint.save={save}",
            f"checkpoint.load={save}",
            "checkpoint.save_interval=null",
            "nvrx_straggler.report_time_interval=1.5",
            "--ft-rank_section_timeouts=setup:60,step:20,checkpointing:30",
            "--ft-rank_out_of_section_timeout=30",
            str(SCRIPTS / "megatron_ft.py"),
            "--save",
            str(save),
            "--iters",
            "100",
            "--save-interval",
            "25",
            "--step-sleep",
            "0.05",
            "--calc-ft-timeouts",
            "--rg-checkpoint",
            "--num-warmup-iters",
            "2",
        ),
        capture_output=True,
        text=True,
        timeout=140,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "done: 100 iterations, restart 0" in out
    # fault tolerance: the section timeouts, as NVRx writes them (the launch's reached
    # the client)
    for marker in (r"\[FaultTolerance\] .*Timeouts=", r"\[RankMonitorServer\] section timeouts: "):
        line = re.search(
            marker + r"SectionTimeouts\(out_of_section=30\.00, sections=\[(.*?)\]", out
        )
        assert line is not None, (marker, out)
        assert sorted(line.group(1).rstrip(", ").split(", ")) == [
            "checkpointing=30.00",
            "setup=60.00",
            "step=20.00",
        ]
    # stragglers: both reports, a score per rank (a report made before every rank's
    # first measurement arrived lists the ranks measured so far: the later ones list all)
    for title in ("relative", "individual"):
        reports = re.findall(
            rf"GPU {title} performance:\n((?:  Rank=\d Node=\S+ Score=\S+\n)+)", out
        )
        assert reports, (title, out)
        ranks = [sorted(re.findall(r"Rank=(\d)", r)) for r in reports]
        assert ["0", "1"] in ranks, (title, ranks)
    # the checkpoint manager's async saves
    assert "Scheduling async checkpoint save at step 25 (persistent)" in out
    # preemption on (Bridge's train.exit_signal_handler) for a script that never asks
    assert "preemption on (preemption.enable_exit_handler, SIGTERM), but the script saves " in out
    # and rerun and in-process restart, which the script never takes up either: said once
    assert out.count("rerun_state_machine on, but the script never calls rg.rerun()") == 1
    assert out.count("inprocess_restart on, but the script is not wrapped") == 1
    # NVRx's file (the script's client) and rankguard's own state in checkpoint.save
    assert "current_timeouts" in json.loads((save / "ft_state.json").read_text())
    own = json.loads((save / "rankguard_ft_state.json").read_text())
    assert own["runs"] == 1 and "timeouts" in own
    run_dir = tmp_path / "heartbeat" / run_id
    # the client, healthy: served, no finding; 0.7's init message reached the bridge
    assert read_jsonl(run_dir / "findings.jsonl") == []
    for rank in (0, 1):
        (hb,) = sorted(run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl"))
        nvrx = [r["nvrx"] for r in read_jsonl(hb) if "nvrx" in r]
        assert nvrx and nvrx[-1]["section_events"] > 0, rank
        assert not nvrx[-1].get("errors"), nvrx[-1]
        if release is not None:  # a 0.4 client sends no warm-up count
            assert nvrx[-1]["num_warmup_iters"] == 2, (rank, nvrx[-1], VERSION)
    assert read_status(run_dir)["state"] == "completed"
    assert no_leftover_workers(run_id)
