"""The launcher's terminal lines (live status, findings, the summary at the end) show
control characters from records escaped."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from rankguard.launcher import run as run_mod
from rankguard.launcher.console import LiveStatus, status_line
from rankguard.schema.findings import Finding, FindingType, Reason

EVIL = "stalled\r\x1b[2K\x1b]0;owned\x07done\x9b"


class _Monitor:
    status: dict[str, Any] = {}

    def add_sink(self, sink: object) -> None:
        pass


def _finding() -> Finding:
    return Finding(
        finding_type=FindingType.PROGRESS_TIMEOUT,
        run_id="r",
        rank=1,
        reason=Reason.NOT_ADVANCING,
        message=EVIL,
        hostname="host\x1b[31m",
    )


def test_finding_line_is_escaped() -> None:
    stream = io.StringIO()
    live = LiveStatus(_Monitor(), stream=stream)  # type: ignore[arg-type]
    live.after_write(_finding())
    line = stream.getvalue()
    assert line.endswith("stalled\\r\\x1b[2K\\x1b]0;owned\\x07done\\x9b\n")
    assert "\x1b" not in line and "\r" not in line and "\x07" not in line


def test_status_line_is_escaped() -> None:
    status = {
        "state": "running\x1b[8m",
        "ranks": [{"process_liveness": "alive\x07", "gpu_progress": "ok\r", "iteration": 3}],
        "summary": {"findings_total": 0},
    }
    line = status_line(status)
    assert "\x1b" not in line and "\x07" not in line and "\r" not in line
    assert "running\\x1b[8m" in line


def test_launcher_summary_escapes_finding_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = {"state": "failed\x1b", "recent_findings": [{"message": EVIL}]}
    run_mod._report(tmp_path, status)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err
    assert "finding: stalled\\r\\x1b[2K" in err
