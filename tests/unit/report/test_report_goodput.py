"""The report's goodput section: a timeline of the ledger's parts with each
interruption, the same ETTR as status.json's goodput block."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rankguard.goodput import Part, ettr_text, read_ledger
from rankguard.goodput.status import GoodputStatus
from rankguard.report import load_run, render_page
from rankguard.report.goodput import GOODPUT_TITLE, PART_COLOURS, goodput_html
from tests.unit.goodput.synthetic import T0, Rank0, append, iso, run_dir, train

pytestmark = pytest.mark.timeout(30)


def _crash_and_restart(tmp_path: Path) -> Path:
    """5 s start-up, 16 steps (a save after 10), a crash, the decision 1.5 s after the
    last step, a restart 4 s later from iteration 10, 10 more steps."""
    d = run_dir(tmp_path)
    a0 = Rank0(d, pid=101, start=T0)
    t = T0 + 5.0
    a0.step(t)
    t = train(a0, t, 15, 0.5, {10: ("checkpointing", 2.0)})
    a0.end(t + 0.3, clean=False)
    a0.write()
    decision = {"kind": "process", "restart": 1, "cause": "worker_failed", "decision": "restart"}
    append(d / "restarts.jsonl", {**decision, "wall_time": iso(t + 1.5)})
    a1 = Rank0(d, pid=202, start=t + 5.5, iteration=10)
    a1.record("heartbeat", t + 6.0)
    t = t + 9.5
    a1.step(t)
    t = train(a1, t, 9, 0.5, {})
    a1.end(t + 0.3, clean=True)
    a1.write()
    return d


def _goodput_svg(page: str) -> str:
    (svg,) = [s for s in re.findall(r"<svg\b.*?</svg>", page, re.S) if GOODPUT_TITLE in s]
    return svg


def test_the_timeline_shows_every_part_and_the_interruption(tmp_path: Path) -> None:
    d = _crash_and_restart(tmp_path)
    data, _ = load_run(d)
    page = render_page(data)
    assert 'id="goodput"' in page and 'href="#goodput"' in page
    svg = _goodput_svg(page)
    root = ET.fromstring(svg)
    assert root.get("aria-label") == GOODPUT_TITLE
    ledger = read_ledger(d)
    assert ledger is not None
    for part in (Part.PRODUCTIVE, Part.STARTUP, Part.RECOMPUTED, Part.CHECKPOINT_STALL):
        assert f">{part.value}</text>" in svg  # a row of its own
        assert f'fill="{PART_COLOURS[part]}"' in svg
    assert ">preemption_drain</text>" not in svg  # no time: no row
    assert "interruption 1: worker_failed at iteration 16, cost" in svg
    # each span drawn, with its times
    assert svg.count("<title>startup: +") == 2 and "<title>recovery: +" in svg
    # the same ETTR as status.json's block and the table of the interruption
    block = GoodputStatus(d).status_fields()["goodput"]
    assert f"ETTR {ettr_text(block.ettr)}:" in page
    assert "<h3>Interruptions</h3>" in page and "worker_failed" in page


def test_no_heartbeat_of_rank_0_is_said_with_an_empty_chart() -> None:
    html = goodput_html(None)
    assert GOODPUT_TITLE in html and "no heartbeat of rank 0" in html


def test_a_job_without_interruption_says_so(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=7, start=T0)
    rank.step(T0 + 3.0)
    t = train(rank, T0 + 3.0, 9, 0.5, {})
    rank.end(t + 0.2, clean=True)
    rank.write()
    html = goodput_html(read_ledger(d))
    assert "No interruption: one attempt ran to its end." in html
    assert ">interruptions</text>" not in html
