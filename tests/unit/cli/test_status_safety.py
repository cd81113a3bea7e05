"""``rankguard status`` with hostile or impossible data: escaped control characters and
dates shown as ``-``, never a raw escape sequence or a traceback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from rankguard.cli import status as status_cli
from rankguard.cli.status_render import render_status

EVIL_HOST = "node-a\x1b]0;pwned\x07\x1b[2J"
EVIL_MESSAGE = "rank 1 stalled\r\x1b[32mall good\x1b[0m\x9b"


def _status(**overrides: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "run_id": "run\x1b[31m",
        "state": "degraded",
        "updated_wall_time": "2024-11-29T10:56:05+00:00",
        "summary": {"ranks_expected": 1, "process_liveness": {"alive\x1b[5m": 1}},
        "ranks": [
            {
                "rank": 0,
                "node_rank": 0,
                "hostname": EVIL_HOST,
                "pid": 11,
                "process_liveness": "alive",
                "gpu_progress": "advancing",
                "phase": "train\x07",
                "active_findings": ["gpu_progress_timeout\x1b"],
            }
        ],
        "gpu_health": {"0\x1b": {"hostname": EVIL_HOST, "status": "ok"}},
        "restarts": [{"restart": 1, "wall_time": "t\x1b", "message": EVIL_MESSAGE}],
        "timeouts": {"step\x1b": {"value": 1, "source": "config\r"}},
    }
    status.update(overrides)
    return status


def _finding(t: Any) -> dict[str, Any]:
    return {
        "finding_type": "gpu_progress_timeout",
        "rank": 1,
        "reason": "rank_alive_but_gpu_progress_not_advancing",
        "hostname": EVIL_HOST,
        "message": EVIL_MESSAGE,
        "detected_wall_time": t,
    }


@pytest.mark.parametrize("color", [False, True])
def test_no_control_character_from_the_data_reaches_the_screen(color: bool) -> None:
    text = render_status(_status(), [_finding("2024-11-29T10:56:02+00:00")], color=color)
    own = text
    for code in ("\x1b[31m", "\x1b[33m", "\x1b[1m", "\x1b[0m"):  # the renderer's colours
        own = own.replace(code, "")
    assert not any(ch in own for ch in "\x1b\x07\r\x9b")
    assert "node-a\\x1b]0;pwned\\x07\\x1b[2J" in text
    assert "rank 1 stalled\\r\\x1b[32mall good\\x1b[0m\\x9b" in text


@pytest.mark.parametrize(
    "when",
    [
        "9999-99-99",
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "garbage",
        1e30,
        -1,
        float("nan"),
        None,
    ],
)
def test_impossible_times_are_shown_as_a_dash(when: Any) -> None:
    text = render_status(_status(updated_wall_time=when), [_finding(when)], width=200)
    assert "updated -" in text
    assert any(line.startswith("-  ") for line in text.splitlines())


def test_status_command_prints_a_hostile_run_without_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "status.json").write_text(
        json.dumps(_status(updated_wall_time="9999-99-99")), encoding="utf-8"
    )
    (tmp_path / "findings.jsonl").write_text(json.dumps(_finding(1e30)) + "\n")
    args = argparse.Namespace(run_dir=tmp_path, json=False, findings=10, watch=None)
    assert status_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "updated -" in out
