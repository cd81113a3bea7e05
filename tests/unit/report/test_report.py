"""``rankguard report``: loading run files, the SVG helpers, the page and the CLI.

Fixture runs are written from the documented schemas (``docs/heartbeat.md``, the perf
reporter and the GPU health collector), so the report is tested against what the
monitors really write, including missing, partial and malformed files.
"""

from __future__ import annotations

import argparse
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rankguard.report import CHART_TITLES, add_parser, load_run, render_page, resolve_run
from rankguard.report.charts import HEATMAP_MAX_ROWS, rank_heatmap
from rankguard.report.svg import Band, Event, Series, Span, heatmap, line_chart, timeline
from rankguard.report.svgbase import fmt_num, nice_ticks, tick_labels
from tests.factories import REPORT_RUN_ID as RUN_ID
from tests.factories import write_report_run as write_run

pytestmark = pytest.mark.timeout(30)

SVG_RE = re.compile(r"<svg\b.*?</svg>", re.S)


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
        "detected: GPT input 8 x 2048 x 4 micro-batches x 8 replicas",
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
    # heartbeat/latest (a default run id's newest launch): a pointer, not one more run
    (tmp_path / "heartbeat" / "latest").symlink_to("run-old")
    assert "2 run(s)" in str(resolve_run(tmp_path)[3])
    assert resolve_run(tmp_path / "heartbeat" / "latest")[:3] == (
        "run-old",
        old,
        tmp_path / "perf_monitor" / "run-old",
    )


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
