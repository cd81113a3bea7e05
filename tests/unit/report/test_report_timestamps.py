"""``rankguard report`` with impossible wall times: shown as ``-``, never a traceback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from rankguard.report import add_parser, load_run, render_page
from rankguard.report.wallclock import epoch_s, fmt_clock, iso_epoch_s, ns_epoch_s
from tests.factories import report_finding, write_jsonl, write_report_run

pytestmark = pytest.mark.timeout(30)

ABSURD: list[Any] = [1e30, -1, 0, float("nan"), float("inf"), "9999-99-99", 10**400, True, None]


@pytest.mark.parametrize("value", ABSURD)
def test_impossible_values_are_not_times(value: Any) -> None:
    assert ns_epoch_s(value) is None
    assert epoch_s(value) is None
    assert fmt_clock(value) == "-"


@pytest.mark.parametrize(
    "text", ["9999-99-99", "0001-01-01T00:00:00+14:00", "1969-07-20T20:17:00Z", "soon", ""]
)
def test_impossible_iso_strings_are_not_times(text: str) -> None:
    assert iso_epoch_s(text) is None


def test_possible_times_still_format() -> None:
    assert fmt_clock(1732877765.0) == "2024-11-29 10:56:05 UTC"
    assert ns_epoch_s(1732877765_000_000_000) == 1732877765.0
    assert iso_epoch_s("2024-11-29T10:56:05Z") == 1732877765.0


def _hostile_run(tmp_path: Path) -> Path:
    findings = [
        report_finding(
            1, "gpu_progress_timeout", "rank_alive_but_gpu_progress_not_advancing", "m1", 30.0
        ),
        report_finding(
            0,
            "rank_process_heartbeat_timeout",
            "rank_process_or_heartbeat_thread_unresponsive",
            "m2",
            40.0,
        ),
    ]
    findings[0]["detected_wall_time"] = "9999-99-99"
    findings[1]["detected_wall_time"] = "0001-01-01T00:00:00+14:00"
    run_dir = write_report_run(tmp_path, findings=findings)
    status = json.loads((run_dir / "status.json").read_text())
    status["updated_wall_time"] = "9999-12-31T23:59:59-14:00"
    (run_dir / "status.json").write_text(json.dumps(status))
    for rank, (start, end) in enumerate([(1e30, -1), (-1, 10**30), (0, 1e30), ("x", None)]):
        write_jsonl(
            run_dir / f"rank_{rank}_pid_{4100 + rank}.heartbeat.jsonl",
            [
                {"event": "process_start", "wall_time_ns": start},
                {"event": "heartbeat", "wall_time_ns": end},
            ],
        )
    return run_dir


def test_page_renders_with_impossible_times(tmp_path: Path) -> None:
    data, note = load_run(_hostile_run(tmp_path))
    assert all(p.start is None and p.end is None for p in data.processes)
    page = render_page(data, note=note)
    assert page.rstrip().endswith("</html>")
    assert "9999-99-99" not in page


def test_cli_writes_a_report_for_impossible_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _hostile_run(tmp_path)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["report", str(run_dir)])
    assert args.func(args) == 0
    assert Path(capsys.readouterr().out.strip()).is_file()
