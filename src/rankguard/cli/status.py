"""``rankguard status RUN_DIR``: show what the heartbeat monitor knows about a run.

The monitor on node 0 atomically replaces ``status.json`` every scan and appends to
``findings.jsonl`` (schemas in ``docs/heartbeat.md``). This command only reads those two
files, so it is safe to run at any time, from any host that sees the log directory, while
the job runs or after it died. It keeps the three facts about a rank apart in its table:
process liveness, training progress, and GPU hardware health.

The reader is tolerant on purpose: unknown keys are ignored, missing keys print as ``-``,
a malformed or partially written ``findings.jsonl`` line is skipped, and a malformed
``status.json`` is reported as such (exit code 2) rather than as a traceback. The reading
itself is library code (:mod:`rankguard.view.runfiles`); this module is the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rankguard.cli.status_render import render_status
from rankguard.schema.layout import EXCLUDED_NODES_FILE, FINDINGS_FILE, STATUS_FILE
from rankguard.schema.status import RankRow, mark_selected, raw_rank_rows
from rankguard.util.textsafe import safe_text
from rankguard.view.runfiles import (
    StatusUnavailable,
    excluded_lines,
    latest_findings,
    launcher_gone,
    load_status,
    parse_rank_spec,
    rank_rows,
    read_excluded,
    read_findings,
    worst_rows,
)

__all__ = ["add_parser", "read_findings", "render_status", "run"]

EXIT_OK = 0
EXIT_UNAVAILABLE = 2


def _resolve_run_dir(path: Path) -> tuple[Path, str | None]:
    """The run directory to show and, when it was picked among several, a note saying so."""
    if not path.exists():
        raise StatusUnavailable(f"no such directory: {path}")
    if not path.is_dir():
        raise StatusUnavailable(f"not a directory: {path}")
    if (path / STATUS_FILE).exists() or (path / EXCLUDED_NODES_FILE).exists():
        return path, None  # the second: a node excluded before any status was written
    candidates: list[tuple[float, str, Path]] = []
    for pattern in (f"heartbeat/*/{STATUS_FILE}", f"*/{STATUS_FILE}"):
        for status_file in path.glob(pattern):
            if status_file.parent.is_symlink():  # heartbeat/latest: a run listed already
                continue
            try:
                mtime = status_file.stat().st_mtime
            except OSError:
                continue
            candidates.append((mtime, str(status_file.parent), status_file.parent))
    if not candidates:
        raise StatusUnavailable(
            f"no {STATUS_FILE} in {path}: expected a run directory "
            f"<log_dir>/heartbeat/<run_id>/, a <log_dir>/heartbeat directory or a log dir"
        )
    _, _, chosen = max(candidates)
    note = (
        f"rankguard status: using the most recently updated run directory {chosen} "
        f"(1 of {len(candidates)} under {path})"
    )
    return chosen, note


def _positive_float(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return seconds


def _non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return n


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``rankguard status`` on ``subparsers``."""
    parser = subparsers.add_parser(
        "status",
        help="show the heartbeat monitor's view of a run",
        description=(
            "Show process liveness, training progress and GPU health of every rank, "
            "from the monitor's status.json and findings.jsonl. Exit code 2 when the "
            "directory or status.json is missing or unreadable."
        ),
    )
    parser.add_argument(
        "run_dir",
        type=Path,
        help=(
            "a run directory <log_dir>/heartbeat/<run_id>/, or a log dir or <log_dir>/heartbeat "
            "(then the most recently updated run is shown)"
        ),
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print {run_dir, status, findings} as JSON (one line per redraw with --watch)",
    )
    parser.add_argument(
        "--findings",
        type=_non_negative_int,
        default=10,
        metavar="N",
        help="how many of the latest findings to show (default: 10)",
    )
    parser.add_argument(
        "--watch",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="redraw every SECONDS until Ctrl-C",
    )
    parser.add_argument(
        "--ranks",
        type=_rank_spec,
        default=None,
        metavar="SPEC",
        help="show only these ranks, e.g. 10-20,35 (a large job's other ranks come from "
        "status_ranks.json)",
    )
    parser.add_argument(
        "--worst",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="show only the N ranks most in need of a look (active findings, stale, "
        "stalled, longest without progress)",
    )
    parser.set_defaults(func=run)


def _rank_spec(value: str) -> set[int]:
    try:
        return parse_rank_spec(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _use_color() -> bool:
    # https://no-color.org: NO_COLOR set to a non-empty value disables colour.
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _error(message: str) -> int:
    print(f"rankguard status: {safe_text(message)}", file=sys.stderr)
    return EXIT_UNAVAILABLE


def _excluded_frame(run_dir: Path, args: argparse.Namespace) -> str | None:
    """A run directory without a status but with ``excluded_nodes.json``: this node was
    excluded before the monitor could start (bad-node exclusion)."""
    if read_excluded(run_dir) is None:
        return None
    if args.json:
        return json.dumps({"run_dir": str(run_dir), "excluded": read_excluded(run_dir)}) + "\n"
    return "\n".join(safe_text(line) for line in excluded_lines(run_dir)) + "\n"


def _frame(run_dir: Path, args: argparse.Namespace, tty: bool) -> str:
    try:
        status = load_status(run_dir)
    except StatusUnavailable:
        excluded = _excluded_frame(run_dir, args)
        if excluded is None:
            raise
        return excluded
    ranks: set[int] | None = getattr(args, "ranks", None)
    worst: int | None = getattr(args, "worst", None)
    if ranks is not None or worst is not None:
        mark_selected(status)
    if ranks is not None:
        status["ranks"] = [*rank_rows(run_dir, status, ranks)]
    if worst is not None:
        # the rows picked as they came (a status_ranks.json row has its first columns)
        raw = raw_rank_rows(status)
        typed = [RankRow.from_dict(r) for r in raw]
        by_id = {id(t): r for t, r in zip(typed, raw, strict=True)}
        status["ranks"] = [by_id[id(t)] for t in worst_rows(typed, worst)]
    try:
        findings = latest_findings(run_dir, status, args.findings)
    except OSError as exc:
        print(f"rankguard status: cannot read {FINDINGS_FILE}: {exc}", file=sys.stderr)
        findings = []
    gone = launcher_gone(status)
    if args.json:
        doc = {
            "run_dir": str(run_dir),
            "status": status,
            "findings": findings,
            "launcher_gone": gone,
        }
        excluded_doc = read_excluded(run_dir)
        if excluded_doc is not None:
            doc["excluded"] = excluded_doc
        indent = None if args.watch else 2
        return json.dumps(doc, indent=indent, default=str) + "\n"
    width = shutil.get_terminal_size().columns if tty else None
    text = render_status(
        status,
        findings,
        width=width,
        color=_use_color(),
        now=datetime.now(timezone.utc),
        launcher_gone=gone,
    )
    extra = excluded_lines(run_dir)  # bad-node exclusion
    return text + "".join(safe_text(line) + "\n" for line in extra)


def run(args: argparse.Namespace) -> int:
    """Run ``rankguard status``; 0 when shown, 2 when the run cannot be read."""
    try:
        run_dir, note = _resolve_run_dir(Path(args.run_dir))
    except StatusUnavailable as exc:
        return _error(str(exc))
    if note:
        print(safe_text(note), file=sys.stderr)
    tty = sys.stdout.isatty()
    if args.watch is None:
        try:
            sys.stdout.write(_frame(run_dir, args, tty))
        except StatusUnavailable as exc:
            return _error(str(exc))
        return EXIT_OK
    try:
        while True:
            if tty and not args.json:
                sys.stdout.write("\x1b[H\x1b[2J")
            try:
                sys.stdout.write(_frame(run_dir, args, tty))
            except StatusUnavailable as exc:
                print(f"rankguard status: {exc} (retrying every {args.watch:g}s)", file=sys.stderr)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK
