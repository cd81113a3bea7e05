"""``rankguard report``: loading run files, the SVG helpers, the page and the CLI.

Fixture runs are written from the documented schemas (``docs/heartbeat.md``, the perf
reporter and the GPU health collector), so the report is tested against what the
monitors really write, including missing, partial and malformed files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from rankguard.report import CHART_TITLES, add_parser, load_run, render_page, resolve_run
from rankguard.report.charts import HEATMAP_MAX_ROWS, rank_heatmap
from rankguard.report.svg import Band, Event, Series, Span, heatmap, line_chart, timeline
from rankguard.report.svgbase import fmt_num, nice_ticks, tick_labels

pytestmark = pytest.mark.timeout(30)

RUN_ID = "20241129-105400-ab12cd"
T0 = datetime(2024, 11, 29, 10, 54, 0, tzinfo=timezone.utc)
EVIL = "rank 1 <b>stalled</b> & nobody noticed"
SVG_RE = re.compile(r"<svg\b.*?</svg>", re.S)


def _iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def finding(rank: int | None, ftype: str, reason: str, message: str, at: float) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "run_id": RUN_ID,
        "finding_type": ftype,
        "reason": reason,
        "rank": rank,
        "pid": None if rank is None else 4100 + rank,
        "hostname": "node-a",
        "node_rank": 0,
        "local_rank": rank,
        "process_liveness": "alive",
        "gpu_progress": "stalled",
        "phase": "train",
        "iteration": 30,
        "checkpoint_active": False,
        "timeout_s": 60.0,
        "observed_s": 61.4,
        "gpu": None,
        "gpu_health": None,
        "exit": None,
        "message": message,
        "detected_wall_time": _iso(at),
    }


FINDINGS = [
    finding(1, "gpu_progress_timeout", "rank_alive_but_gpu_progress_not_advancing", EVIL, 30.0),
    finding(None, "gpu_hardware_health_warning", "gpu_warning", "GPU 3 thermal slowdown", 42.5),
]


def _perf_entry(it: int, ms: float) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "run_id": RUN_ID,
        "rank": 0,
        "iteration": it,
        "step": it,
        "timestamp": _iso(5 + it * ms / 1000),
        "step_time_ms": ms,
        "gpu_step_time_ms": ms * 0.98,
        "samples_per_sec": round(256_000 / ms, 2),
        "tokens_per_sec": round(256_000 * 2048 / ms, 2),
        "TFLOPS_per_GPU": round(400 * 100 / ms, 4),
        "TFLOPS_total": round(8 * 400 * 100 / ms, 4),
        "MFU": round(400 * 100 / ms / 989, 4),
        "memory_GB": 61.2,
        "peak_memory_GB": 63.9,
        "memory_kind": "cuda_allocated",
        "data_loading_share": 0.01,
        "steps_in_window": 10,
    }


def _summary(entries: list[dict[str, Any]], world: int) -> dict[str, Any]:
    return {
        "session_info": {
            "start_time": _iso(1),
            "end_time": _iso(60),
            "total_iterations": entries[-1]["iteration"],
            "run_id": RUN_ID,
            "world_size": world,
            "device": "NVIDIA H100 80GB HBM3",
            "dtype": "bf16",
            "peak_tflops_per_gpu": 989.0,
            "peak_source": "table:H100 SXM",
            "flops_per_step": 3.2e15,
            "flops_source": "analytic: Megatron GPT formula",
            "warmup_iterations": 3,
            "steps_in_statistics": 77,
            "log_interval": 10,
        },
        "final_statistics": {
            "avg_tflops_per_gpu": 401.2,
            "avg_tflops_total": 3209.6,
            "avg_mfu": 0.4057,
            "avg_step_time_ms": 99.7,
            "median_step_time_ms": 99.1,
            "min_step_time_ms": 97.0,
            "max_step_time_ms": 181.0,
            "avg_samples_per_sec": 2567.7,
            "avg_tokens_per_sec": 5258650.0,
            "peak_memory_gb": 63.9,
        },
        "iteration_logs": entries,
    }


def _rank_row(rank: int, slow: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "pid": 4100 + rank,
        "hostname": "node-a",
        "node_rank": 0,
        "local_rank": rank,
        "process_liveness": "alive",
        "gpu_progress": "stalled" if rank == slow else "progressing",
        "iteration": 80,
        "progress_seq": 80,
        "phase": "train",
        "checkpoint_active": False,
        "heartbeat_age_s": 0.4,
        "progress_age_s": 61.4 if rank == slow else 0.2,
        "gpu": {"ordinal": rank, "token": str(rank), "uuid": None},
        "gpu_health": {"index": rank, "health": "ok", "problems": []},
        "exit": None,
        "active_findings": ["gpu_progress_timeout"] if rank == slow else [],
        "blocked_by": [] if rank == slow else [slow],
    }


def _gpu(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index:04d}",
        "name": "NVIDIA H100 80GB HBM3",
        "temperature_c": 61 + index,
        "utilization_gpu_pct": 97,
        "memory_used_mib": 62000,
        "memory_total_mib": 81559,
        "power_draw_w": 650.5,
        "ecc_corrected_volatile": 0,
        "ecc_uncorrected_volatile": 0,
        "thermal_slowdown": index == 3,
        "health": "warning" if index == 3 else "ok",
        "problems": ["thermal_slowdown"] if index == 3 else [],
    }


def write_run(
    log_dir: Path,
    *,
    run_id: str = RUN_ID,
    world: int = 4,
    windows: int = 8,
    slow: int = 1,
    heartbeat: bool = True,
    perf: bool = True,
    findings: list[dict[str, Any]] | None = None,
) -> Path:
    """Write a realistic run under ``log_dir``; returns its heartbeat run directory."""
    hb, pm = log_dir / "heartbeat" / run_id, log_dir / "perf_monitor" / run_id
    iters = [1] + [10 * i for i in range(1, windows)]
    if heartbeat:
        hb.mkdir(parents=True)
        status = {
            "schema_version": 1,
            "run_id": run_id,
            "updated_wall_time": _iso(60),
            "state": "degraded",
            "monitor": {"hostname": "node-a", "pid": 4000, "expected_world_size": world},
            "summary": {"ranks_expected": world, "findings_total": 2, "findings_active": 1},
            "ranks": [_rank_row(r, slow) for r in range(world)],
            "gpu_health": {"0": {"status": "warning", "source": "nvml", "gpus": 4}},
            "recent_findings": findings if findings is not None else FINDINGS,
        }
        (hb / "status.json").write_text(json.dumps(status))
        _jsonl(hb / "findings.jsonl", findings if findings is not None else FINDINGS)
        lines = []
        for it in iters:
            by_rank = {
                str(r): 100.0 + r + (80.0 if r == slow and it == 30 else 0) for r in range(world)
            }
            vals = sorted(by_rank.values())
            lines.append(
                {
                    "schema_version": 1,
                    "run_id": run_id,
                    "step": it,
                    "iteration": it,
                    "n_ranks": world,
                    "world_size": world,
                    "step_time_ms": {
                        "min": vals[0],
                        "median": vals[len(vals) // 2],
                        "max": vals[-1],
                    },
                    "slowest_rank": max(by_rank, key=by_rank.__getitem__),
                    "fastest_rank": 0,
                    "by_rank": by_rank,
                }
            )
        _jsonl(hb / "perf_ranks.jsonl", lines)
        for r in range(min(world, 8)):
            base = {"run_id": run_id, "rank": r, "pid": 4100 + r, "hostname": "node-a"}
            _jsonl(
                hb / f"rank_{r}_pid_{4100 + r}.heartbeat.jsonl",
                [
                    {
                        **base,
                        "event": "process_start",
                        "seq": 0,
                        "wall_time_ns": int((T0.timestamp() + 1) * 1e9),
                    },
                    {
                        **base,
                        "event": "heartbeat",
                        "seq": 1,
                        "wall_time_ns": int((T0.timestamp() + 59) * 1e9),
                    },
                ],
            )
        snap = {
            "schema_version": 1,
            "source": "nvml",
            "status": "warning",
            "error": None,
            "hostname": "node-a",
            "collected_wall_time": _iso(40),
            "gpus": [_gpu(i) for i in range(4)],
            "node_rank": 0,
        }
        (hb / "gpu_health_node_0.json").write_text(json.dumps(snap))
    if perf:
        entries = [_perf_entry(it, 180.0 if it == 30 else 100.0 - it / 100) for it in iters]
        _jsonl(pm / "perf.jsonl", entries)
        (pm / "perf_summary_20241129_105500.json").write_text(json.dumps(_summary(entries, world)))
    return hb if heartbeat else pm


def _svgs(page: str) -> list[str]:
    return SVG_RE.findall(page)


def _page(path: Path) -> str:
    data, note = load_run(path)
    return render_page(data, note=note)


# --------------------------------------------------------------------------- the page


def test_page_is_one_self_contained_document(tmp_path: Path) -> None:
    page = _page(write_run(tmp_path))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<html") == 1 and page.count("<body") == 1
    assert f"<title>rankguard report · {RUN_ID}</title>" in page
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(" not in page


def test_page_has_an_svg_per_chart_with_its_title(tmp_path: Path) -> None:
    page = _page(write_run(tmp_path))
    svgs = _svgs(page)
    assert len(svgs) == len(CHART_TITLES)
    for svg, title in zip(svgs, CHART_TITLES, strict=True):
        root = ET.fromstring(svg)
        assert root.get("aria-label") == title
        assert root.find("{http://www.w3.org/2000/svg}title").text == title  # type: ignore[union-attr]
    assert page.count("<polyline") >= 5  # step time, TFLOP/s, tokens, samples, memory
    assert "progress timeout at iteration 30: rank 1" in svgs[0]  # the finding, marked


def test_header_and_key_numbers(tmp_path: Path) -> None:
    page = _page(write_run(tmp_path))
    for text in (
        "degraded",
        "NVIDIA H100 80GB HBM3",
        "analytic: Megatron GPT formula",
        "table:H100 SXM",
        "99.7",
        "5.26M",
        "401",
        "40.6",
        "63.9",
    ):
        assert text in page, text


def test_findings_table_lists_findings_escaped(tmp_path: Path) -> None:
    page = _page(write_run(tmp_path))
    assert "rank 1 &lt;b&gt;stalled&lt;/b&gt; &amp; nobody noticed" in page
    assert "<b>stalled</b>" not in page
    assert "gpu_progress_timeout" in page and "gpu_hardware_health_warning" in page
    assert "GPU 3 thermal slowdown" in page
    assert "Findings (2)" in page


def test_status_table_and_gpu_health(tmp_path: Path) -> None:
    page = _page(write_run(tmp_path))
    assert "stalled" in page and "progressing" in page and "Blocked by" in page
    assert "thermal_slowdown" in page and "NVIDIA H100 80GB HBM3" in page
    assert "60.5 / 79.6" in page  # GiB used / total


def test_missing_perf_still_renders_and_says_so(tmp_path: Path) -> None:
    page = _page(write_run(tmp_path, perf=False))
    assert "Perf data is missing" in page
    assert len(_svgs(page)) == len(CHART_TITLES)
    assert "no TFLOP/s" in page  # the empty chart says why
    assert "<polygon" in page  # the cross-rank band still draws from perf_ranks.jsonl


def test_perf_only_run(tmp_path: Path) -> None:
    pm = write_run(tmp_path, heartbeat=False)
    data, note = load_run(pm)
    assert data.has_perf and not data.has_heartbeat and note is None
    page = render_page(data)
    assert "Heartbeat data is missing" in page
    assert "No per-rank status" in page and "No findings" in page
    assert len(_svgs(page)) == len(CHART_TITLES)


def test_heartbeat_only_log_dir(tmp_path: Path) -> None:
    write_run(tmp_path, perf=False)
    data, note = load_run(tmp_path)
    assert data.heartbeat_dir == tmp_path / "heartbeat" / RUN_ID and data.perf_dir is None
    assert note is not None and RUN_ID in note


def test_run_dir_with_only_broken_files(tmp_path: Path) -> None:
    hb = tmp_path / "heartbeat" / RUN_ID
    hb.mkdir(parents=True)
    (hb / "status.json").write_text('{"state": "runn')
    (hb / "findings.jsonl").write_text('not json\n{"finding_type": "gpu_progress_timeout"}\n{"x"')
    data, _ = load_run(hb)
    page = render_page(data)
    assert any("malformed" in p for p in data.problems)
    assert any("Skipped 2 malformed line(s) in findings.jsonl" in p for p in data.problems)
    assert len(data.findings) == 1
    assert "status.json is malformed" in page and "Perf data is missing" in page
    for svg in _svgs(page):
        ET.fromstring(svg)


def test_log_dir_picks_the_newest_run(tmp_path: Path) -> None:
    old = write_run(tmp_path, run_id="run-old")
    new = write_run(tmp_path, run_id="run-new")
    os.utime(old / "status.json", (1e9, 1e9))
    for path in new.iterdir():
        os.utime(path, (2e9, 2e9))
    run_id, hb, perf, note = resolve_run(tmp_path)
    assert (run_id, hb, perf) == ("run-new", new, tmp_path / "perf_monitor" / "run-new")
    assert note is not None and "run-new" in note and "2 run(s)" in note
    assert resolve_run(tmp_path / "heartbeat")[0] == "run-new"
    assert resolve_run(tmp_path / "perf_monitor" / "run-old")[1] == old


def test_heatmap_aggregates_many_ranks_keeping_the_slowest(tmp_path: Path) -> None:
    data, _ = load_run(write_run(tmp_path, world=256, slow=77, perf=False))
    svg, caption = rank_heatmap(data)
    ET.fromstring(svg)
    assert "groups of 8 ranks" in caption
    labels = re.findall(r'dy="0.32em" text-anchor="end" fill="#59636e">([^<]+)</text>', svg)
    assert len(labels) == HEATMAP_MAX_ROWS and labels[0] == "0\u20137"
    assert "72\u201379, 30: 257 ms" in svg  # rank 77's stall survives the aggregation


# --------------------------------------------------------------------------- CLI


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rankguard")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_writes_default_output_and_prints_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    assert _cli(["report", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    target = tmp_path / "heartbeat" / RUN_ID / "report.html"
    assert out.strip() == str(target) and target.stat().st_size > 10_000
    assert "using the newest run" in err
    custom = tmp_path / "out" / "r.html"
    assert _cli(["report", str(tmp_path / "heartbeat" / RUN_ID), "-o", str(custom)]) == 0
    assert custom.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("sub", ["", "missing"])
def test_cli_exit_2_when_nothing_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sub: str
) -> None:
    (tmp_path / "heartbeat" / "empty-run").mkdir(parents=True)
    assert _cli(["report", str(tmp_path / sub)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankguard report: ")
    assert ("nothing to report" if not sub else "no such directory") in err


# --------------------------------------------------------------------------- SVG helpers


def _xml(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def test_line_chart_empty_single_and_flat() -> None:
    assert "nothing yet" in ET.tostring(
        _xml(line_chart("T", [], x_label="x", y_label="y", empty="nothing yet")), "unicode"
    )
    _xml(line_chart("T", [Series("s", [], "#000")], x_label="x", y_label="y"))
    one = line_chart("T", [Series("s", [(5.0, 3.0)], "#000")], x_label="x", y_label="y (ms)")
    assert "<circle" in one and "nan" not in one.lower()
    _xml(one)
    flat = line_chart("T", [Series("s", [(1, 0.0), (2, 0.0)], "#000")], x_label="x", y_label="y")
    _xml(flat)
    band = line_chart(
        "T", [], bands=[Band("b", [(1.0, 2.0, 3.0)], "#ccc")], x_label="x", y_label="y"
    )
    _xml(band)
    noisy = [(float(i), float("nan") if i == 3 else float(i % 7)) for i in range(5000)]
    big = line_chart("T<&>", [Series("s", noisy, "#000")], x_label="x", y_label="y")
    assert "T&lt;&amp;&gt;" in big and len(big) < 100_000
    _xml(big)


def test_heatmap_and_timeline_degenerate_inputs() -> None:
    _xml(heatmap("H", [], [], [], x_label="x", y_label="y", unit="ms"))
    _xml(heatmap("H", ["0"], ["1"], [[None]], x_label="x", y_label="y", unit="ms"))
    one = heatmap("H", ["0"], ["1"], [[5.0]], x_label="x", y_label="y", unit="ms")
    assert "<rect" in one
    _xml(one)
    _xml(
        heatmap(
            "H",
            ["0", "1"],
            ["1", "2"],
            [[1.0, None], [2.0, 3.0]],
            x_label="x",
            y_label="y",
            unit="ms",
        )
    )
    _xml(timeline("T", [], [], [], x_label="s"))
    _xml(timeline("T", ["rank 0"], [], [Event(0, 3.0, "#f00", "diamond", "<x>")], x_label="s"))
    _xml(timeline("T", ["rank 0"], [Span(0, 1.0, 1.0, "zero length")], [], x_label="s"))
    _xml(
        timeline(
            "T",
            ["a", "b"],
            [Span(0, 0, 9, "s")],
            [Event(5, 1, "#f00", "square", "off")],
            x_label="s",
        )
    )


def test_number_formatting_and_ticks() -> None:
    assert [fmt_num(v) for v in (None, 0, 12345, 999_999, 2.5e9, 0.0042)] == [
        "-",
        "0",
        "12.3k",
        "1M",
        "2.5G",
        "0.0042",
    ]
    assert tick_labels(nice_ticks(0, 15000)) == ["0", "5k", "10k", "15k"]
    assert tick_labels(nice_ticks(0, 0.006)) == ["0", "0.002", "0.004", "0.006"]
    assert nice_ticks(3, 3) == [3] and nice_ticks(float("nan"), 1) == []
