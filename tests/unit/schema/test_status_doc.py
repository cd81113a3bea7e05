"""StatusDoc: status.json read and written through one typed object, its keys and
their order exactly those users' scripts read."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.goodput.status import GoodputStatus
from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.layout import health_file_name
from rankguard.schema.status import StatusDoc, parse_findings
from rankguard.util.fs import atomic_write_json
from tests.factories import FakeClock, heartbeat_config, publisher_record, read_status
from tests.factories import write_heartbeats as write

RUN = "run-doc"
KEYS_FILE = Path(__file__).parent / "data" / "status_keys.json"
rec = partial(publisher_record, run_id=RUN)


class _Evaluator:
    name = "stragglers"

    def evaluate(self, now: float, ranks: Any) -> list[Any]:
        return []

    def status(self) -> Any:
        return {"report": 1, "stragglers": [], "worst": [], "best": []}


class _Source:
    def status_fields(self) -> dict[str, Any]:
        return {"timeouts": {"process_timeout_s": {"value": 10.0, "source": "config"}}}


def sample_status(run_dir: Path, *, rows: int = 1000) -> dict[str, Any]:
    """The status.json of a small scenario: rank 0 progressing, rank 1 ended in error
    (a finding), rank 2 stalled (blocked by rank 1), rank 3 never seen, one node's GPU health."""
    clock = FakeClock()
    mon = JobMonitor(
        heartbeat_config(scan_interval_s=0.05, status_rank_rows=rows, status_worst_ranks=2),
        run_dir,
        RUN,
        expected_world_size=4,
        clock=clock,
        check_pids=False,
        config_snapshot={"heartbeat": {"enabled": True}},
        evaluators=[_Evaluator()],
        status_sources=[_Source(), GoodputStatus(run_dir)],
    )
    health = {
        "schema_version": 1,
        "source": "nvml",
        "status": "ok",
        "error": None,
        "hostname": "host0",
        "node_rank": 0,
        "gpus": [{"index": 0, "uuid": "GPU-0", "health": "ok", "problems": []}],
    }
    atomic_write_json(run_dir / health_file_name(0), health)
    for seq in range(3):
        write(run_dir, rec(0, seq, progress_seq=seq, perf={"step_time_ms": 5.0}))
        write(run_dir, rec(1, seq, progress_seq=seq))
        write(run_dir, rec(2, seq, progress_seq=1))
        mon.scan_once()
        clock.t += 1
    exit_info = {"clean": False, "exit_code": 1, "error": "boom"}
    write(run_dir, rec(1, 3, event="process_end", progress_seq=2, exit=exit_info))
    for seq in range(3, 30):
        write(run_dir, rec(0, seq, progress_seq=seq), rec(2, seq, progress_seq=1, since=seq))
        clock.t += 1
        mon.scan_once()
    mon.wait_rank_detail()
    return read_status(run_dir)


def key_tree(value: Any) -> Any:
    """The keys of ``value``, in order, nested (a list by its first element)."""
    if isinstance(value, dict):
        return [[k, key_tree(v)] for k, v in value.items()]
    if isinstance(value, list):
        return [key_tree(value[0])] if value else []
    return None


def _trees(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    return {
        "small": key_tree(sample_status(tmp_path / "small")),
        "large": key_tree(sample_status(tmp_path / "large", rows=2)),
    }


def test_status_keys_are_those_written_before(tmp_path: Path) -> None:
    """status.json keeps its keys and their order (scripts read them)."""
    expected = json.loads(KEYS_FILE.read_text(encoding="utf-8"))
    assert _trees(tmp_path) == expected


@pytest.mark.parametrize("rows", [1000, 2])
def test_a_written_status_reads_back_to_the_same_bytes(tmp_path: Path, rows: int) -> None:
    status = sample_status(tmp_path, rows=rows)
    doc = StatusDoc.from_dict(status)
    assert json.dumps(doc.to_dict()) == json.dumps(status)
    assert doc.state == status["state"] and doc.run_id == RUN
    assert doc.summary.ranks_expected == 4
    assert doc.monitor.scan_count == status["monitor"]["scan_count"]
    assert doc.rank_detail.complete is (rows == 1000)
    assert doc.block("timeouts") == status["timeouts"]
    assert doc.block("stragglers") == status["stragglers"]
    assert [r.rank for r in doc.ranks] == [r["rank"] for r in status["ranks"]]
    findings, bad = doc.findings()
    assert bad == 0
    assert {f.finding_type.value for f in findings} == {
        "rank_process_exited",
        "rank_process_heartbeat_timeout",
    }


def test_evaluator_blocks_and_source_fields_keep_their_places() -> None:
    raw = {
        "schema_version": 1,
        "state": "running",
        "stragglers": None,
        "rerun": {"x": 1},
        "recent_findings": [],
        "restarts": [],
        "checkpoints": {"last": {}},
    }
    doc = StatusDoc.from_dict(raw)
    assert doc.blocks == {"rerun": {"x": 1}}
    assert doc.fields == {"restarts": [], "checkpoints": {"last": {}}}
    assert list(doc.to_dict())[-3:] == ["recent_findings", "restarts", "checkpoints"]


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        "text",
        {"ranks": "x", "summary": [], "monitor": 3, "gpu_health": [1], "rank_detail": "y"},
        {"ranks": [1, None, {"rank": "0", "pid": 1.5, "active_findings": "z"}]},
        {"summary": {"process_liveness": {"alive": "2", "stale": 1}}, "recent_findings": {}},
        {"gpu_health": {"0": "ok", "1": {"status": 3, "age_s": "old"}}, "disks": []},
    ],
)
def test_any_input_reads_without_raising(raw: Any) -> None:
    doc = StatusDoc.from_dict(raw)
    assert isinstance(doc.to_dict(), dict)
    for row in doc.ranks:
        assert row.rank is None or isinstance(row.rank, int)
        assert isinstance(row.active_findings, list)
    assert all(type(n) is int for n in doc.summary.process_liveness.values())


def test_bad_finding_lines_are_skipped_and_counted() -> None:
    good = {
        "finding_type": "gpu_progress_timeout",
        "reason": "rank_alive_but_gpu_progress_not_advancing",
        "rank": 1,
        "run_id": "r",
        "message": "m",
    }
    lines = [good, {"finding_type": "from_the_future"}, "x", {**good, "rank": "1"}, {}]
    findings, bad = parse_findings(lines)
    assert [f.rank for f in findings] == [1] and bad == 4


if __name__ == "__main__":  # pragma: no cover - regenerates the reference keys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        KEYS_FILE.write_text(json.dumps(_trees(Path(tmp)), indent=1) + "\n", encoding="utf-8")


def test_rank_row_blocks_read_typed() -> None:
    """A row's exit, GPU, matched GPU health and perf window, and the job's perf line,
    read as typed values; a value of the wrong type reads as None, never raises."""
    doc = StatusDoc.from_dict(
        {
            "ranks": [
                {
                    "rank": 0,
                    "exit": {"clean": False, "exit_code": -15, "after_failure_of_rank": 3},
                    "gpu": {"token": "GPU-aaaa", "ordinal": 0},
                    "gpu_health": {"index": 2, "uuid": "GPU-aaaa", "health": "warning"},
                    "perf": {"step_time_ms": 120, "MFU": 0.41, "memory_GB": "lots"},
                },
                {"rank": 1, "exit": {"clean": "no", "after_shutdown": 1}, "gpu": None},
            ],
            "perf": {"iteration": 7, "step_time_ms": {"min": 100, "median": "x"}},
        }
    )
    first, second = doc.ranks
    assert first.exit_info is not None and first.exit_info.after_failure_of_rank == 3
    assert (first.exit_info.clean, first.exit_info.exit_code) == (False, -15)
    assert first.gpu_info is not None and first.gpu_info.ordinal == 0
    assert first.gpu_health_info is not None and first.gpu_health_info.index == 2
    assert first.gpu_health_info.health == "warning"
    assert (first.perf_info.step_time_ms, first.perf_info.memory_gb) == (120.0, None)
    assert second.exit_info is not None and second.exit_info.clean is None
    assert second.exit_info.after_shutdown is None
    assert second.gpu_info is None and second.gpu_health_info is None
    assert second.perf_info.mfu is None
    assert doc.perf_info.iteration == 7 and doc.perf_info.step_time_ms == {"min": 100.0}


def test_rank_table_reads_the_rows_asked_for() -> None:
    """``status_ranks.json``: the rows of the ranks asked for, by rank, keyed by the
    columns; a row that is not a list or has no rank first is skipped."""
    from rankguard.schema.status import RankTable

    assert RankTable.from_json({"rows": [[0, 1]]}) is None
    assert RankTable.from_json([["rank"], [0]]) is None
    table = RankTable.from_json(
        {"columns": ["rank", "pid"], "rows": [[0, 10], [1, 11], "x", [], ["2", 12], [3, 13]]}
    )
    assert table is not None
    assert table.rows_of({1, 3}) == {1: {"rank": 1, "pid": 11}, 3: {"rank": 3, "pid": 13}}
