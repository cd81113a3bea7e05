"""A large job's status: counts over every rank and rows of the worst in status.json,
every rank in status_ranks.json; ``rankguard status --ranks/--worst``; the Prometheus
exporter's per-rank series budget."""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.cli.status import add_parser
from rankguard.monitor.monitor import DETAIL_COLUMNS, JobMonitor
from rankguard.schema.findings import FindingType
from rankguard.schema.layout import STATUS_RANKS_FILE
from rankguard.schema.status import RankRow
from rankguard.view.runfiles import parse_rank_spec, rank_rows, worst_rows
from tests.factories import FakeClock, heartbeat_config, heartbeat_record, read_status

RUN = "run-scale"
WORLD = 40

rec = partial(heartbeat_record, run_id=RUN, world_size=WORLD, since=0.5, gpu_token=None)


def _monitor(tmp_path: Path, clock: FakeClock, **cfg: Any) -> JobMonitor:
    return JobMonitor(
        heartbeat_config(**cfg),
        tmp_path,
        RUN,
        expected_world_size=WORLD,
        clock=clock,
        check_pids=False,
    )


def _feed(mon: JobMonitor, clock: FakeClock, *, stuck: int | None = None) -> None:
    """Every rank but ``WORLD - 1`` (never seen) publishes once a second; ``stuck``
    stops stepping."""
    for seq in range(1, 4):
        clock.t += 1.0
        for rank in range(WORLD - 1):
            since = 0.5 + (seq if rank == stuck else 0)
            mon.rules.ingest(
                rec(rank, seq, progress_seq=1 if rank == stuck else seq, since=since), clock.t
            )
        mon.scan_once()


@pytest.fixture(autouse=True)
def gc_thresholds() -> Any:
    """A large job's monitor raises the collector's thresholds: restored after each test."""
    import gc

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_large_jobs_monitor_collects_garbage_less_often(tmp_path: Path) -> None:
    import gc

    from rankguard.monitor.monitor import LARGE_JOB_GC_THRESHOLD

    _monitor(tmp_path, FakeClock(0.0))  # 40 ranks, status_rank_rows 4096: small
    assert gc.get_threshold() == (700, 10, 10)
    _monitor(tmp_path, FakeClock(0.0), status_rank_rows=16)
    assert gc.get_threshold() == LARGE_JOB_GC_THRESHOLD
    gc.set_threshold(1000, 10, 10)  # someone chose: left alone
    _monitor(tmp_path, FakeClock(0.0), status_rank_rows=16)
    assert gc.get_threshold() == (1000, 10, 10)


@pytest.fixture
def large(tmp_path: Path) -> JobMonitor:
    clock = FakeClock(100.0)
    mon = _monitor(tmp_path, clock, status_rank_rows=16, status_worst_ranks=5)
    _feed(mon, clock, stuck=7)
    mon.rules.ranks[3].active.add(FindingType.PROGRESS_TIMEOUT)  # one rank with a finding
    mon.rules.ranks[3].fired.add(FindingType.PROGRESS_TIMEOUT)  # written, as _fire does
    mon.scan_once()
    mon.wait_rank_detail()
    return mon


def test_small_job_lists_every_rank_as_before(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    mon = _monitor(tmp_path, clock)
    _feed(mon, clock)
    status = read_status(tmp_path)
    assert [r["rank"] for r in status["ranks"]] == list(range(WORLD))
    assert status["rank_detail"] == {
        "complete": True,
        "listed": WORLD,
        "file": None,
        "written_wall_time": None,
    }
    assert not (tmp_path / STATUS_RANKS_FILE).exists()


def test_large_job_lists_the_worst_and_counts_every_rank(large: JobMonitor) -> None:
    status = read_status(large.run_dir)
    rows = status["ranks"]
    assert len(rows) == 5
    assert rows[0]["rank"] == 3  # an active finding first
    assert rows[1]["rank"] == 7  # then the longest without progress
    assert status["rank_detail"]["complete"] is False
    assert status["rank_detail"]["file"] == STATUS_RANKS_FILE
    summary = status["summary"]
    assert sum(summary["process_liveness"].values()) == WORLD
    assert summary["process_liveness"]["not_observed"] == 1
    assert summary["process_liveness"]["alive"] == WORLD - 1
    assert summary["findings_active"] == 1
    assert status["state"] == "degraded"
    assert set(rows[0]) == set(large.rank_rows()[0].to_dict())  # full rows


def test_status_ranks_json_has_every_rank(large: JobMonitor) -> None:
    doc = json.loads((large.run_dir / STATUS_RANKS_FILE).read_text())
    assert doc["columns"] == list(DETAIL_COLUMNS)
    assert [row[0] for row in doc["rows"]] == list(range(WORLD))
    row = dict(zip(doc["columns"], doc["rows"][7], strict=True))
    assert row["gpu_progress"] == "progressing" and row["progress_seq"] == 1
    assert doc["rows"][WORLD - 1][1:] == [None] * (len(DETAIL_COLUMNS) - 1)
    assert (
        read_status(large.run_dir)["rank_detail"]["written_wall_time"] == doc["updated_wall_time"]
    )


def test_the_status_names_rows_written_after_its_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status_ranks.json is written off the scan thread: when its write ends after the
    scan's status.json (a loaded machine; the run's end, whose last rows follow the last
    scan), waiting for it leaves status.json naming it, not the file before or none."""
    import threading

    from rankguard.monitor import status as status_rows

    gate = threading.Event()
    real = status_rows.detail_rows

    def held(*args: Any) -> Any:
        gate.wait(30)
        return real(*args)

    monkeypatch.setattr(status_rows, "detail_rows", held)
    clock = FakeClock(100.0)
    mon = _monitor(tmp_path, clock, status_rank_rows=16, status_worst_ranks=5)
    _feed(mon, clock)  # the first scan starts the rows' write, held past the last scan
    assert read_status(tmp_path)["rank_detail"]["written_wall_time"] is None
    gate.set()
    mon.wait_rank_detail()
    doc = json.loads((tmp_path / STATUS_RANKS_FILE).read_text())
    assert read_status(tmp_path)["rank_detail"]["written_wall_time"] == doc["updated_wall_time"]


def test_rank_rows_come_from_the_detail_file(large: JobMonitor) -> None:
    status = read_status(large.run_dir)
    rows = rank_rows(large.run_dir, status, {10, 11, 3})
    assert [r["rank"] for r in rows] == [3, 10, 11]
    assert "gpu" in rows[0]  # rank 3 is listed in status.json: its full row
    assert rows[1]["process_liveness"] == "alive" and "gpu" not in rows[1]


def test_parse_rank_spec() -> None:
    assert parse_rank_spec("10-12,35") == {10, 11, 12, 35}
    for bad in ("a", "5-2", "-1", "1-"):
        with pytest.raises(ValueError):
            parse_rank_spec(bad)


def test_worst_rows_order() -> None:
    rows = [
        {"rank": 0, "progress_age_s": 1.0},
        {"rank": 1, "progress_age_s": 9.0},
        {"rank": 2, "gpu_progress": "stalled", "progress_age_s": 2.0},
        {"rank": 3, "active_findings": ["x"]},
    ]
    assert [r.rank for r in worst_rows([RankRow.from_dict(r) for r in rows], 3)] == [3, 2, 1]


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="rankguard")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["status", *argv])
    rc: int = args.func(args)
    return rc


def test_status_command_ranks_and_worst(large: JobMonitor, capsys: Any) -> None:
    assert _cli(str(large.run_dir)) == 0
    out = capsys.readouterr().out
    assert "the 5 ranks most in need of a look" in out and "--ranks A-B" in out
    assert _cli(str(large.run_dir), "--ranks", "20-22", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in doc["status"]["ranks"]] == [20, 21, 22]
    assert _cli(str(large.run_dir), "--worst", "2", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in doc["status"]["ranks"]] == [3, 7]
    with pytest.raises(SystemExit):
        _cli(str(large.run_dir), "--ranks", "x")


def test_exporter_keeps_a_per_rank_series_budget(large: JobMonitor) -> None:
    pytest.importorskip("prometheus_client")
    from rankguard.exporter.collector import FindingCounts, StatusCollector

    def series(collector: StatusCollector) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for fam in collector.collect():
            for sample in fam.samples:
                if "rank" in sample.labels:
                    out.setdefault(sample.name, set()).add(sample.labels["rank"])
        return out

    budget = series(StatusCollector(large, FindingCounts(), rank_series=2))
    assert budget["rankguard_rank_heartbeat_age_seconds"] == {"3", "7"}  # the worst two
    listed = series(StatusCollector(large, FindingCounts(), rank_series=64))
    assert len(listed["rankguard_rank_heartbeat_age_seconds"]) == 5  # status.json's rows
    every = series(StatusCollector(large, FindingCounts(), all_ranks=True))
    assert len(every["rankguard_rank_process_liveness"]) == WORLD
    fams = {f.name: f for f in StatusCollector(large, FindingCounts(), rank_series=2).collect()}
    assert fams["rankguard_exporter_ranks_with_series"].samples[0].value == 2.0
    assert fams["rankguard_job_ranks_process_liveness"].samples  # job level, always
