"""``rankguard status RUN_DIR``: show what the heartbeat monitor knows about a run.

The monitor on node 0 atomically replaces ``status.json`` every scan and appends to
``findings.jsonl`` (schemas in ``docs/heartbeat.md``). This command only reads those two
files, so it is safe to run at any time, from any host that sees the log directory, while
the job runs or after it died. It keeps the three facts about a rank apart in its table:
process liveness, training progress, and GPU hardware health.

The reader is tolerant on purpose: unknown keys are ignored, missing keys print as ``-``,
a malformed or partially written ``findings.jsonl`` line is skipped, and a malformed
``status.json`` is reported as such (exit code 2) rather than as a traceback.
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
from typing import Any

from rankguard.cli.status_render import render_status
from rankguard.textsafe import safe_text

__all__ = ["add_parser", "read_findings", "render_status", "run"]

STATUS_FILE = "status.json"
FINDINGS_FILE = "findings.jsonl"
EXIT_OK = 0
EXIT_UNAVAILABLE = 2

_CHUNK = 64 * 1024  # bytes read per step when tailing findings.jsonl backwards


class StatusUnavailable(Exception):
    """The run directory or its status.json cannot be used; the message says why."""


# --------------------------------------------------------------------------- reading


def _parse_line(raw: bytes) -> dict[str, Any] | None:
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def read_findings(path: str | os.PathLike[str], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` valid JSON objects of ``findings.jsonl``, oldest first.

    The file is read backwards in chunks, so a long file costs only its tail. Malformed
    lines and a partially written last line are skipped. A missing file means no findings
    yet and gives ``[]``; other I/O errors propagate.
    """
    if limit <= 0:
        return []
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with block below
    except FileNotFoundError:
        return []
    found: list[dict[str, Any]] = []
    with fh:
        pos = fh.seek(0, os.SEEK_END)
        head = b""  # the possibly incomplete first line of what has been read so far
        while pos > 0 and len(found) < limit:
            step = min(_CHUNK, pos)
            pos -= step
            fh.seek(pos)
            lines = (fh.read(step) + head).split(b"\n")
            head = lines[0]
            for raw in reversed(lines[1:]):
                rec = _parse_line(raw)
                if rec is not None:
                    found.append(rec)
                    if len(found) >= limit:
                        break
        if pos == 0 and len(found) < limit:
            rec = _parse_line(head)
            if rec is not None:
                found.append(rec)
    found.reverse()
    return found


def _load_status(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATUS_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as exc:
        raise StatusUnavailable(f"no {STATUS_FILE} in {run_dir}") from exc
    except OSError as exc:
        raise StatusUnavailable(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise StatusUnavailable(
            f"{path} is malformed or partially written ({exc}); "
            "the monitor replaces it atomically, so another process may have written it"
        ) from exc
    if not isinstance(obj, dict):
        raise StatusUnavailable(
            f"{path} is malformed: expected a JSON object, got {type(obj).__name__}"
        )
    return obj


def _resolve_run_dir(path: Path) -> tuple[Path, str | None]:
    """The run directory to show and, when it was picked among several, a note saying so."""
    if not path.exists():
        raise StatusUnavailable(f"no such directory: {path}")
    if not path.is_dir():
        raise StatusUnavailable(f"not a directory: {path}")
    if (path / STATUS_FILE).exists():
        return path, None
    candidates: list[tuple[float, str, Path]] = []
    for pattern in (f"heartbeat/*/{STATUS_FILE}", f"*/{STATUS_FILE}"):
        for status_file in path.glob(pattern):
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


def _findings_for(run_dir: Path, status: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Latest findings from findings.jsonl, or status.json's copy when the file is absent."""
    if limit <= 0:
        return []
    if (run_dir / FINDINGS_FILE).exists():
        return read_findings(run_dir / FINDINGS_FILE, limit)
    recent = status.get("recent_findings")
    if isinstance(recent, list):
        return [f for f in recent if isinstance(f, dict)][-limit:]
    return []


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
    parser.set_defaults(func=run)


def _use_color() -> bool:
    # https://no-color.org: NO_COLOR set to a non-empty value disables colour.
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _error(message: str) -> int:
    print(f"rankguard status: {safe_text(message)}", file=sys.stderr)
    return EXIT_UNAVAILABLE


def _frame(run_dir: Path, args: argparse.Namespace, tty: bool) -> str:
    status = _load_status(run_dir)
    try:
        findings = _findings_for(run_dir, status, args.findings)
    except OSError as exc:
        print(f"rankguard status: cannot read {FINDINGS_FILE}: {exc}", file=sys.stderr)
        findings = []
    if args.json:
        doc = {"run_dir": str(run_dir), "status": status, "findings": findings}
        indent = None if args.watch else 2
        return json.dumps(doc, indent=indent, default=str) + "\n"
    width = shutil.get_terminal_size().columns if tty else None
    return render_status(
        status, findings, width=width, color=_use_color(), now=datetime.now(timezone.utc)
    )


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
