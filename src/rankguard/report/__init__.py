"""Run reports: one self-contained HTML page per run (``rankguard report``).

``load_run`` reads a run's heartbeat and perf files (tolerating missing or broken ones),
``render_page`` turns them into the page, and ``cli`` wires both to the command line.
The page needs no JavaScript and no network: inline CSS and inline SVG charts only.
"""

from __future__ import annotations

from rankguard.report.cli import add_parser, run
from rankguard.report.data import ReportUnavailable, RunData, load_run, resolve_run
from rankguard.report.page import CHART_TITLES, render_page

__all__ = [
    "CHART_TITLES",
    "ReportUnavailable",
    "RunData",
    "add_parser",
    "load_run",
    "render_page",
    "resolve_run",
    "run",
]
