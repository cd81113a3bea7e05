"""The goodput ledger of a real run with a crash and a restart: its parts match the
steps rank 0 timed itself (each within 0.5 s) and sum to the wall time; status.json,
`rankguard status`, the report, the Prometheus series and the perf summary show the
same ETTR."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .conftest import rankguard_cmd, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CRASH_ONCE = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, restart = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for step in range(1, 21):
        if restart == 0 and rank == 1 and step == 9:
            raise RuntimeError("injected crash at step 9")
        model(torch.ones(4, 8)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        times.append(time.time())
        if rank == 0:  # the test's own clock: when each step ended
            with open(sys.argv[1], "a") as fh:
                fh.write(json.dumps({"restart": restart, "step": step, "t": times[-1]}) + "\\n")
        time.sleep(0.15)
    dist.destroy_process_group()
    """
)


def test_a_crash_and_a_restart_are_accounted_for(tmp_path: Path, run_id: str) -> None:
    """A real launch, its ranks and their restart forked from the ``--preload`` fork
    server (how long they take to start is the ledger's to measure, whatever it is)."""
    script = tmp_path / "train.py"
    script.write_text(CRASH_ONCE)
    steps_log = tmp_path / "steps.jsonl"
    log_dir = tmp_path / "logs"
    res = run_rankguard(
        [
            *standalone_run(run_id, log_dir),
            *("--max-restarts", "1", "--preload", "torch"),
            *(str(script), str(steps_log)),
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = log_dir / "heartbeat" / run_id
    out = subprocess.run(
        rankguard_cmd("goodput", str(run_dir), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    ledger = json.loads(out.stdout)
    parts = ledger["parts_s"]
    assert sum(parts.values()) == pytest.approx(ledger["wall_s"], rel=0.01)
    assert ledger["attempts"] == 2 and len(ledger["interruptions"]) == 1
    steps = [json.loads(line) for line in steps_log.read_text().splitlines()]
    first = [s["t"] for s in steps if s["restart"] == 0]
    second = [s["t"] for s in steps if s["restart"] == 1]
    assert len(second) == 20 and 7 <= len(first) <= 8
    # attempt 0's steps are done again from step 1 (no checkpoint); attempt 1's count
    assert parts["recomputed"] == pytest.approx(first[-1] - first[0], abs=0.5)
    assert parts["productive"] == pytest.approx(second[-1] - second[0], abs=0.5)
    assert ledger["ettr"] == pytest.approx(parts["productive"] / ledger["wall_s"], abs=1e-3)
    # the wall time runs from the launch: the launcher's own start is start-up
    launcher = json.loads((run_dir / "launcher_node_0.json").read_text())
    launched = launcher["started_unix_s"]
    assert ledger["start_unix_s"] == pytest.approx(launched, abs=1e-3)
    # ... to the launcher seeing its last ranks gone (their exit after the last record)
    assert ledger["end_unix_s"] == pytest.approx(launcher["ended_unix_s"], abs=1e-3)
    assert launcher["ended_unix_s"] >= second[-1]
    assert parts["startup"] > first[0] - launched - 0.5  # launch -> first step, and more
    (cut,) = ledger["interruptions"]
    assert cut["resumed_from"] == 0 and cut["iteration"] == len(first)
    assert cut["parts"]["recovery"] > 0 and cut["parts"]["startup"] > 0
    assert cut["first_evidence_s"] is not None  # rank 1's exit on its error
    _rank_0_stopped_before_its_last_record(run_dir, tmp_path, first)
    text = subprocess.run(
        rankguard_cmd("goodput", str(run_dir)), capture_output=True, text=True, timeout=60
    ).stdout
    assert text.startswith(f"goodput of {run_id}: wall ") and "interruption 1: attempt 0" in text
    _the_same_ettr_everywhere(run_dir, ledger)


def _rank_0_stopped_before_its_last_record(
    run_dir: Path, tmp_path: Path, first: list[float]
) -> None:
    """The stale case made sure of: rank 0's records of attempt 0 from its last step on
    left out (the agent stopped it, waiting in the all-reduce of step 9, before its next
    heartbeat); rank 1's exit record, as the rank bootstrap wrote it on its way out,
    still gives the step every rank completed and its time."""
    from rankguard.goodput import Part, read_ledger

    logs = Path(shutil.copytree(run_dir.parent.parent, tmp_path / "stale"))
    copy = logs / "heartbeat" / run_dir.name
    files = sorted(
        copy.glob("rank_0_pid_*.heartbeat.jsonl"),
        key=lambda f: json.loads(f.read_text().splitlines()[0])["wall_time_ns"],
    )
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    kept = [r for r in records if r["event"] != "process_end" and r["progress_seq"] < len(first)]
    # nothing left out when the run itself stopped rank 0 before its last step's record
    # (a loaded machine: its heartbeat came later than its step): the copy is that case
    assert all(r["progress_seq"] <= len(first) for r in records), records
    files[0].write_text("".join(json.dumps(r) + "\n" for r in kept))
    ledger = read_ledger(copy)
    assert ledger is not None
    cut = ledger.interruptions[0]
    assert cut.iteration == len(first) and cut.at == pytest.approx(first[-1], abs=0.5)
    assert cut.parts[Part.RECOMPUTED] == pytest.approx(first[-1] - first[0], abs=0.5)


def _the_same_ettr_everywhere(run_dir: Path, ledger: dict[str, Any]) -> None:
    from rankguard.exporter.collector import build_families
    from rankguard.goodput import ettr_text
    from rankguard.report import load_run, render_page

    status = json.loads((run_dir / "status.json").read_text())
    block = status["goodput"]
    assert block["final"] is True and block["ettr"] == ledger["ettr"]
    assert block["parts_s"] == ledger["parts_s"]
    screen = subprocess.run(
        rankguard_cmd("status", str(run_dir)), capture_output=True, text=True, timeout=60
    ).stdout
    assert f"Goodput: ETTR {ettr_text(ledger['ettr'])} (productive" in screen
    data, _ = load_run(run_dir)
    assert f"ETTR {ettr_text(ledger['ettr'])}: productive training" in render_page(data)
    families = build_families(
        status, scans=1, scan_errors=0, last_scan_s=0.0, finding_counts={}, now_wall=0.0
    )
    (gauge,) = [f for f in families if f.name == "rankguard_goodput_ettr_ratio"]
    assert gauge.samples[0].value == ledger["ettr"]
    perf_dir = run_dir.parent.parent / "perf_monitor" / run_dir.name
    (summary,) = perf_dir.glob("perf_summary_*.json")
    assert json.loads(summary.read_text())["final_statistics"]["ettr"] == ledger["ettr"]
