"""``rankguard report RUN_DIR [-o OUT.html]``: write a run's report as one HTML file.

Reads only the files a run leaves behind (see ``docs/report.md``), so it works during
the run, after it, and on any host that sees the log directory. ``RUN_DIR`` is a
heartbeat run directory ``<log_dir>/heartbeat/<run_id>``, a perf directory
``<log_dir>/perf_monitor/<run_id>`` or a log directory (its newest run is used and named
on stderr). Exit codes: 0 written, 2 nothing to report or the output cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rankguard.report.data import ReportUnavailable, load_run
from rankguard.report.page import render_page
from rankguard.util.fs import atomic_write_text
from rankguard.view.runfiles import launcher_gone
from rankguard.view.statusnotes import frozen_status

__all__ = ["EXIT_OK", "EXIT_UNAVAILABLE", "REPORT_FILE", "add_parser", "run"]

REPORT_FILE = "report.html"
EXIT_OK = 0
EXIT_UNAVAILABLE = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a run (charts, findings, rank status)",
        description="Write one HTML page about a run: step time, throughput, TFLOP/s, memory, "
        "per-rank step times, findings on a timeline, rank status and GPU health. The page "
        "has no scripts or external resources and works offline.",
    )
    p.add_argument(
        "run_dir",
        type=Path,
        help="<log_dir>/heartbeat/<run_id>, <log_dir>/perf_monitor/<run_id> or a log dir "
        "(its newest run)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help=f"HTML file to write (default: <run_dir>/{REPORT_FILE}, in the run's "
        "heartbeat directory when RUN_DIR is a log dir)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        data, note = load_run(Path(args.run_dir))
    except ReportUnavailable as exc:
        print(f"rankguard report: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if note:
        print(f"rankguard report: {note}", file=sys.stderr)
    gone = launcher_gone(data.status) if data.status else None
    if gone:  # its last status is no live view: no rank is shown alive or progressing
        data.status = frozen_status(data.status or {})
        note = f"{note}; {gone}" if note else gone
    out: Path | None = args.output
    if out is None:
        run_dir = data.heartbeat_dir or data.perf_dir or Path(args.run_dir)
        out = run_dir / REPORT_FILE
    try:
        atomic_write_text(out, render_page(data, note=note))
    except OSError as exc:
        print(f"rankguard report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(out)
    return EXIT_OK
