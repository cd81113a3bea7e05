"""``rankguard status``: rendering, JSON output, run-dir picking and tolerant reading."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rankguard.cli import status as status_cli
from rankguard.cli import status_render
from rankguard.cli.status import add_parser, read_findings, render_status
from rankguard.view import runfiles

RUN_ID = "run-20241129-1054"


def _finding(rank: int | None, ftype: str, reason: str, message: str, t: str) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "run_id": RUN_ID,
        "finding_type": ftype,
        "reason": reason,
        "rank": rank,
        "pid": 4102 if rank == 1 else None,
        "hostname": "node-a",
        "node_rank": 0,
        "local_rank": rank,
        "process_liveness": "alive",
        "gpu_progress": "stalled",
        "phase": "train",
        "iteration": 118,
        "checkpoint_active": False,
        "timeout_s": 60.0,
        "observed_s": 61.4,
        "gpu": {"ordinal": 1, "token": "GPU-bbbb", "uuid": "GPU-bbbb"},
        "gpu_health": None,
        "detected_wall_time": t,
        "message": message,
    }


FINDINGS = [
    _finding(
        None,
        "gpu_hardware_health_warning",
        "gpu_warning",
        "GPU 3 on node-a reports a correctable ECC burst.",
        "2024-11-29T10:55:00+00:00",
    ),
    _finding(
        1,
        "gpu_progress_timeout",
        "rank_alive_but_gpu_progress_not_advancing",
        "Rank 1 is alive but its GPU step has not completed for 61.4 s.",
        "2024-11-29T10:56:02.512345+00:00",
    ),
]


def _rank(rank: int, pid: int, liveness: str, progress: str, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rank": rank,
        "pid": pid,
        "hostname": "node-a" if rank < 2 else "node-b",
        "node_rank": 0 if rank < 2 else 1,
        "local_rank": rank % 2,
        "process_liveness": liveness,
        "gpu_progress": progress,
        "iteration": 120,
        "progress_seq": 120,
        "phase": "train",
        "checkpoint_active": False,
        "heartbeat_age_s": 1.234,
        "progress_age_s": 0.51,
        "gpu": {"ordinal": rank % 2, "token": f"GPU-{rank}aaa", "uuid": f"GPU-{rank}aaa"},
        "gpu_health": {"status": "healthy"},
        "exit": None,
        "active_findings": [],
    }
    row.update(extra)
    return row


def make_status() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "run_id": RUN_ID,
        "updated_wall_time": "2024-11-29T10:56:05.000000+00:00",
        "state": "degraded",
        "monitor": {"hostname": "node-a", "pid": 4000, "scan_count": 57, "expected_world_size": 3},
        "summary": {
            "ranks_expected": 3,
            "ranks_observed": 3,
            "process_liveness": {"alive": 2, "stale": 1},
            "gpu_progress": {"progressing": 1, "stalled": 1, "unknown": 1},
            "findings_total": 2,
            "findings_active": 1,
        },
        "ranks": [
            _rank(0, 4101, "alive", "progressing"),
            _rank(
                1,
                4102,
                "alive",
                "stalled",
                iteration=118,
                progress_age_s=61.4,
                active_findings=["gpu_progress_timeout"],
            ),
            _rank(
                2,
                5201,
                "stale",
                "unknown",
                heartbeat_age_s=95.0,
                progress_age_s=None,
                gpu=None,
                gpu_health=None,
                future_key={"nested": True},
            ),
        ],
        "gpu_health": {
            "0": {"status": "healthy", "source": "nvml", "hostname": "node-a", "age_s": 12.34},
        },
        "recent_findings": FINDINGS,
    }


def write_run(base: Path, run_id: str = RUN_ID, findings_text: str | None = None) -> Path:
    run_dir = base / "heartbeat" / run_id
    run_dir.mkdir(parents=True)
    status = make_status()
    status["run_id"] = run_id
    (run_dir / "status.json").write_text(json.dumps(status, indent=2))
    if findings_text is None:
        findings_text = "".join(json.dumps(f) + "\n" for f in FINDINGS)
    (run_dir / "findings.jsonl").write_text(findings_text)
    return run_dir


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="rankguard")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_parser(subparsers)
    args = parser.parse_args(["status", *argv])
    rc: int = args.func(args)
    return rc


def _row(out: str, rank: int) -> list[str]:
    for line in out.splitlines():
        cells = line.split()
        if len(cells) > 3 and cells[0] == str(rank) and cells[2].startswith("node-"):
            return cells
    raise AssertionError(f"no row for rank {rank} in:\n{out}")


def test_table_shows_every_rank_with_its_states(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_run(tmp_path)
    assert run_cli(str(run_dir)) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert RUN_ID in header and "degraded" in header and "3/3" in header
    assert "stale=1" in header and "stalled=1" in header and "findings 2 (1 active)" in header
    table_header = out.splitlines()[2]
    for column in ("RANK", "LIVENESS", "PROGRESS", "HB AGE", "PROG AGE", "GPU HEALTH"):
        assert column in table_header

    r0, r1, r2 = _row(out, 0), _row(out, 1), _row(out, 2)
    assert r0[4:6] == ["alive", "progressing"] and "GPU-0aaa" in r0 and "1.2" in r0
    assert r1[4:6] == ["alive", "stalled"] and "61.4" in r1 and r1[-1] == "prog_timeout"
    assert r2[4:6] == ["stale", "unknown"] and "95.0" in r2
    assert r2[-3:] == ["-", "-", "-"]  # no GPU, no GPU health, no findings

    assert "GPU health" in out and "nvml" in out and "12.3" in out
    assert "rank_alive_but_gpu_progress_not_advancing" in out
    assert "Rank 1 is alive but its GPU step has not completed" in out
    assert "2024-11-29 10:56:02Z" in out
    assert "\x1b" not in out


def test_json_output_parses_and_carries_findings(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_run(tmp_path)
    assert run_cli(str(run_dir), "--json", "--findings", "1") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_dir"] == str(run_dir)
    assert doc["status"]["run_id"] == RUN_ID
    assert [f["finding_type"] for f in doc["findings"]] == ["gpu_progress_timeout"]


def test_json_falls_back_to_recent_findings_without_file(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_run(tmp_path)
    (run_dir / "findings.jsonl").unlink()
    assert run_cli(str(run_dir), "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["findings"]) == 2


@pytest.mark.parametrize("sub", ["", "heartbeat"])
def test_picks_latest_run_dir_from_log_dir(tmp_path: Path, capsys: Any, sub: str) -> None:
    old = write_run(tmp_path, "run-old")
    new = write_run(tmp_path, "run-new")
    os.utime(old / "status.json", (2_000_000_000, 2_000_000_000))  # newer, despite creation
    os.utime(new / "status.json", (1_000_000_000, 1_000_000_000))
    assert run_cli(str(tmp_path / sub), "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["run_dir"] == str(old)
    assert str(old) in captured.err and "most recently updated" in captured.err


def test_the_latest_link_is_not_one_more_run(tmp_path: Path, capsys: Any) -> None:
    old = write_run(tmp_path, "none-1")
    write_run(tmp_path, "none-2")
    os.utime(old / "status.json", (2_000_000_000, 2_000_000_000))
    (tmp_path / "heartbeat" / "latest").symlink_to("none-1")
    assert run_cli(str(tmp_path), "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["run_dir"] == str(old)
    assert "(1 of 2 under" in captured.err, captured.err


def test_missing_dir_exits_2_with_message(tmp_path: Path, capsys: Any) -> None:
    assert run_cli(str(tmp_path / "nope")) == 2
    captured = capsys.readouterr()
    assert "no such directory" in captured.err and captured.out == ""


def test_dir_without_status_exits_2(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "heartbeat" / "r1").mkdir(parents=True)
    assert run_cli(str(tmp_path)) == 2
    assert "no status.json" in capsys.readouterr().err


@pytest.mark.parametrize("text", ['{"schema_version": 1, "run_id": "ru', "[1, 2]", ""])
def test_malformed_status_exits_2_without_traceback(tmp_path: Path, capsys: Any, text: str) -> None:
    run_dir = write_run(tmp_path)
    (run_dir / "status.json").write_text(text)
    assert run_cli(str(run_dir)) == 2
    captured = capsys.readouterr()
    assert "malformed" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


def test_malformed_findings_lines_are_skipped(tmp_path: Path, capsys: Any) -> None:
    good = [json.dumps(f) for f in FINDINGS]
    text = "\n".join([good[0], "not json", "[1,2]", "", good[1], '{"finding_type": "gpu_pro'])
    run_dir = write_run(tmp_path, findings_text=text)
    assert [f["reason"] for f in read_findings(run_dir / "findings.jsonl", 10)] == [
        "gpu_warning",
        "rank_alive_but_gpu_progress_not_advancing",
    ]
    assert run_cli(str(run_dir), "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["findings"]) == 2


def test_read_findings_tails_across_chunks(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(runfiles, "_CHUNK", 7)
    path = tmp_path / "findings.jsonl"
    lines = [json.dumps({"n": i, "pad": "x" * i}) for i in range(20)]
    lines.insert(10, "{broken")
    path.write_text("\n".join(lines) + "\n")
    assert [f["n"] for f in read_findings(path, 3)] == [17, 18, 19]
    assert [f["n"] for f in read_findings(path, 100)] == list(range(20))
    assert read_findings(path, 0) == []
    assert read_findings(tmp_path / "absent.jsonl", 5) == []


def test_color_only_when_asked() -> None:
    plain = render_status(make_status(), FINDINGS, color=False)
    assert "\x1b" not in plain
    colored = render_status(make_status(), FINDINGS, color=True)
    assert "\x1b[31mstalled" in colored and "\x1b[31mstale" in colored
    assert "\x1b[33mgpu_hardware_health_warning" in colored


def test_exited_rank_and_missing_keys(tmp_path: Path) -> None:
    status = make_status()
    status["ranks"][0].update(process_liveness="exited", exit={"clean": False, "exit_code": 1})
    status["ranks"][2] = {"rank": 2}  # nearly empty: the schema may change
    del status["summary"]
    out = render_status(status, [], color=False)
    assert "exited (err)" in out
    assert any(line.split() == ["2"] + ["-"] * 12 for line in out.splitlines())
    assert "Latest findings: none" in out
    status["ranks"][0]["exit"] = {"clean": True, "exit_code": 0}
    assert "exited (err)" not in render_status(status, [], color=False)


def test_width_clips_lines() -> None:
    out = render_status(make_status(), FINDINGS, width=40, color=True)
    visible = status_render._ANSI_RE.sub("", out)
    assert max(len(line) for line in visible.splitlines()) <= 40


def test_watch_redraws_until_ctrl_c(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    run_dir = write_run(tmp_path)
    calls = []

    def fake_sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli.time, "sleep", fake_sleep)
    assert run_cli(str(run_dir), "--watch", "0.5") == 0
    out = capsys.readouterr().out
    assert calls == [0.5, 0.5] and out.count(RUN_ID) >= 2 and "\x1b[2J" not in out


def test_status_and_report_commands_never_import_torch(tmp_path: Path) -> None:
    """`rankguard status` is run often and by hand: importing torch would cost ~1 s."""
    import subprocess
    import sys

    run_dir = write_run(tmp_path)
    probe = (
        "import sys\n"
        "from rankguard.cli.main import main\n"
        "codes = [main(['status', sys.argv[1]]), main(['status', sys.argv[1], '--json'])]\n"
        "from rankguard.cli.main import build_parser\n"
        "build_parser()\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print('CODES', codes, 'TORCH', loaded[:5])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "CODES [0, 0] TORCH []" in res.stdout, res.stdout[-2000:]


def test_a_rank_waiting_on_a_saving_peer_shows_whom_it_waits_for(
    tmp_path: Path, capsys: Any
) -> None:
    status = make_status()
    status["ranks"] = [
        _rank(0, 4101, "alive", "progressing", phase="checkpointing", progress_age_s=8.0),
        _rank(1, 4102, "alive", "stalled", progress_age_s=8.0, blocked_by=[0]),
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text(json.dumps(status), encoding="utf-8")
    assert run_cli(str(run_dir)) == 0
    out = capsys.readouterr().out
    assert _row(out, 0)[4:8] == ["alive", "progressing", "120", "checkpointing"]
    assert _row(out, 1)[4:6] == ["alive", "blocked:0"]


def test_gpu_health_column_shows_the_verdict_the_monitor_writes() -> None:
    """A row's ``gpu_health`` is the matched GPU entry of the node's snapshot: its
    verdict is under ``health`` (the key the health rules write)."""
    status = make_status()
    status["ranks"][0]["gpu_health"] = {
        "index": 0,
        "uuid": "GPU-0aaa",
        "name": "NVIDIA H100",
        "health": "warning",
        "problems": ["temperature 91 C"],
        "stale": False,
    }
    out = render_status(status, [], color=False)
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["0"])
    assert row[-2] == "warning"
