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
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "read_findings", "render_status", "run"]

STATUS_FILE = "status.json"
FINDINGS_FILE = "findings.jsonl"
EXIT_OK = 0
EXIT_UNAVAILABLE = 2

_CHUNK = 64 * 1024  # bytes read per step when tailing findings.jsonl backwards

_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"
_BOLD = "\x1b[1m"
_RESET = "\x1b[0m"
_STYLES = {"red": _RED, "yellow": _YELLOW, "bold": _BOLD}
_ANSI_RE = re.compile(r"(\x1b\[[0-9;]*m)")

_FINDING_ABBREV = {
    "rank_process_heartbeat_timeout": "hb_timeout",
    "gpu_progress_timeout": "prog_timeout",
    "rank_process_exited": "exited",
    "gpu_hardware_health_failure": "gpu_fail",
    "gpu_hardware_health_warning": "gpu_warn",
}
_WARNING_FINDINGS = frozenset({"gpu_hardware_health_warning"})

_LIVENESS_STYLE = {"stale": "red", "not_observed": "yellow"}
_PROGRESS_STYLE = {"stalled": "red", "unknown": "yellow", "not_observed": "yellow"}
_STATE_STYLE = {"failed": "red", "degraded": "yellow"}
_HEALTH_STYLE = {
    "unhealthy": "red",
    "failure": "red",
    "failed": "red",
    "critical": "red",
    "error": "red",
    "warning": "yellow",
    "degraded": "yellow",
    "stale": "yellow",
    "unknown": "yellow",
}

Row = list[tuple[str, str]]  # cells of (text, style); style "" means plain


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


# --------------------------------------------------------------------------- rendering


def _text(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def _seconds(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.1f}"
    return _text(value)


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _fmt_time(value: Any) -> str:
    parsed = _parse_time(value)
    if parsed is None:
        return _text(value)
    if parsed.tzinfo is None:
        return parsed.strftime("%Y-%m-%d %H:%M:%S")
    return parsed.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _sort_key(value: Any) -> tuple[int, float, str]:
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _ranks(status: dict[str, Any]) -> list[dict[str, Any]]:
    ranks = status.get("ranks")
    if isinstance(ranks, dict):
        ranks = list(ranks.values())
    if not isinstance(ranks, list):
        return []
    rows = [r for r in ranks if isinstance(r, dict)]
    return sorted(rows, key=lambda r: _sort_key(r.get("rank")))


def _paint(text: str, style: str, color: bool) -> str:
    if not color or not style:
        return text
    return f"{_STYLES[style]}{text}{_RESET}"


def _visible_len(text: str) -> int:
    return len(_ANSI_RE.sub("", text))


def _clip(line: str, width: int | None) -> str:
    """Cut ``line`` to ``width`` visible characters, keeping ANSI codes intact."""
    if width is None or width <= 0 or _visible_len(line) <= width:
        return line
    out: list[str] = []
    left = width
    styled = False
    for part in _ANSI_RE.split(line):
        if _ANSI_RE.fullmatch(part):
            out.append(part)
            styled = True
        elif left > 0:
            out.append(part[:left])
            left -= len(part[:left])
    if styled:
        out.append(_RESET)
        return "".join(out)
    return "".join(out).rstrip()


def _table(header: Sequence[str], rows: Sequence[Row], right: set[int], color: bool) -> list[str]:
    widths = [len(h) for h in header]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    last = len(header) - 1

    def fmt(cells: Row) -> str:
        out = []
        for i, (text, style) in enumerate(cells):
            padded = text.rjust(widths[i]) if i in right else text.ljust(widths[i])
            if i == last and i not in right:
                padded = text
            out.append(_paint(padded, style, color))
        return "  ".join(out).rstrip()

    lines = [fmt([(h, "bold") for h in header])]
    lines.extend(fmt(row) for row in rows)
    return lines


def _liveness_cell(rank: dict[str, Any]) -> tuple[str, str]:
    liveness = rank.get("process_liveness")
    exit_info = rank.get("exit")
    if isinstance(exit_info, dict) or liveness == "exited":
        info = _as_dict(exit_info)
        if info.get("clean") is False:
            return "exited (err)", "red"
        return "exited", ""
    text = _text(liveness)
    return text, _LIVENESS_STYLE.get(text, "")


def _health_status(value: Any) -> str:
    if isinstance(value, dict):
        return _text(value.get("status"))
    return _text(value)


def _gpu_token(value: Any) -> str:
    if isinstance(value, dict):
        for key in ("token", "uuid", "ordinal"):
            if value.get(key) is not None:
                return _text(value[key])
        return "-"
    return _text(value)


def _findings_cell(active: Any) -> tuple[str, str]:
    if not isinstance(active, list) or not active:
        return "-", ""
    names = [str(f) for f in active]
    style = "yellow" if all(n in _WARNING_FINDINGS for n in names) else "red"
    return ",".join(_FINDING_ABBREV.get(n, n) for n in names), style


def _phase_cell(rank: dict[str, Any]) -> str:
    phase = _text(rank.get("phase"))
    if rank.get("checkpoint_active") is True and phase != "checkpointing":
        return f"{phase} (ckpt)"
    return phase


def _rank_row(rank: dict[str, Any]) -> Row:
    progress = _text(rank.get("gpu_progress"))
    health = _health_status(rank.get("gpu_health"))
    return [
        (_text(rank.get("rank")), ""),
        (_text(rank.get("node_rank")), ""),
        (_text(rank.get("hostname")), ""),
        (_text(rank.get("pid")), ""),
        _liveness_cell(rank),
        (progress, _PROGRESS_STYLE.get(progress, "")),
        (_text(rank.get("iteration")), ""),
        (_phase_cell(rank), ""),
        (_seconds(rank.get("heartbeat_age_s")), ""),
        (_seconds(rank.get("progress_age_s")), ""),
        (_gpu_token(rank.get("gpu")), ""),
        (health, _HEALTH_STYLE.get(health.lower(), "")),
        _findings_cell(rank.get("active_findings")),
    ]


_RANK_HEADER = (
    "RANK",
    "NODE",
    "HOST",
    "PID",
    "LIVENESS",
    "PROGRESS",
    "ITER",
    "PHASE",
    "HB AGE",
    "PROG AGE",
    "GPU",
    "GPU HEALTH",
    "FINDINGS",
)
_RANK_RIGHT = {0, 1, 3, 6, 8, 9}


def _counts(summary: dict[str, Any], ranks: list[dict[str, Any]], key: str) -> dict[str, int]:
    given = summary.get(key)
    if isinstance(given, dict):
        return {str(k): v for k, v in given.items() if isinstance(v, int) and v}
    return dict(Counter(str(r[key]) for r in ranks if r.get(key) is not None))


def _fmt_counts(counts: dict[str, int], styles: dict[str, str], color: bool) -> str:
    if not counts:
        return "-"
    return " ".join(_paint(f"{k}={n}", styles.get(k, ""), color) for k, n in counts.items())


def _header(
    status: dict[str, Any], ranks: list[dict[str, Any]], color: bool, now: Any
) -> list[str]:
    summary = _as_dict(status.get("summary"))
    monitor = _as_dict(status.get("monitor"))
    state = _text(status.get("state"))
    expected = summary.get("ranks_expected", monitor.get("expected_world_size"))
    observed = summary.get("ranks_observed")
    if observed is None and ranks:
        observed = sum(1 for r in ranks if r.get("process_liveness") not in (None, "not_observed"))
    updated = _fmt_time(status.get("updated_wall_time"))
    parsed = _parse_time(status.get("updated_wall_time"))
    if isinstance(now, datetime) and parsed is not None and parsed.tzinfo is not None:
        updated += f" ({max(0.0, (now - parsed).total_seconds()):.1f}s ago)"
    total = summary.get("findings_total")
    active = summary.get("findings_active")
    findings = _text(total) + (f" ({_text(active)} active)" if active is not None else "")
    liveness = _counts(summary, ranks, "process_liveness")
    progress = _counts(summary, ranks, "gpu_progress")
    return [
        f"run {_text(status.get('run_id'))}",
        "state " + _paint(state, _STATE_STYLE.get(state, ""), color),
        f"updated {updated}",
        f"ranks {_text(observed)}/{_text(expected)} observed",
        f"liveness {_fmt_counts(liveness, _LIVENESS_STYLE, color)}",
        f"progress {_fmt_counts(progress, _PROGRESS_STYLE, color)}",
        f"findings {findings}",
    ]


def _pack(parts: list[str], width: int | None) -> list[str]:
    """Join ``parts`` on one line, or on as few lines of ``width`` as they fit."""
    if width is None or width <= 0:
        return ["  ".join(parts)]
    lines: list[str] = []
    for part in parts:
        if lines and _visible_len(lines[-1]) + 2 + _visible_len(part) <= width:
            lines[-1] += "  " + part
        else:
            lines.append(part)
    return lines


def _health_lines(status: dict[str, Any], color: bool) -> list[str]:
    nodes = _as_dict(status.get("gpu_health"))
    if not nodes:
        return ["GPU health: no data"]
    rows: list[Row] = []
    for node in sorted(nodes, key=_sort_key):
        info = _as_dict(nodes[node])
        health = _text(info.get("status"))
        rows.append(
            [
                (str(node), ""),
                (_text(info.get("hostname")), ""),
                (health, _HEALTH_STYLE.get(health.lower(), "")),
                (_text(info.get("source")), ""),
                (_seconds(info.get("age_s")), ""),
                (_text(info.get("gpus")), ""),
            ]
        )
    header = ("NODE", "HOST", "STATUS", "SOURCE", "AGE (s)", "GPUS")
    return ["GPU health", *_table(header, rows, {0, 4, 5}, color)]


def _finding_lines(findings: Iterable[dict[str, Any]], color: bool) -> list[str]:
    rows: list[Row] = []
    for f in findings:
        ftype = _text(f.get("finding_type"))
        style = "yellow" if ftype in _WARNING_FINDINGS else "red"
        rows.append(
            [
                (_fmt_time(f.get("detected_wall_time")), ""),
                (ftype, style),
                (_text(f.get("rank")), ""),
                (_text(f.get("reason")), ""),
                (_text(f.get("message")), ""),
            ]
        )
    if not rows:
        return ["Latest findings: none"]
    header = ("TIME", "TYPE", "RANK", "REASON", "MESSAGE")
    return [f"Latest findings ({len(rows)})", *_table(header, rows, {2}, color)]


def render_status(
    status: dict[str, Any],
    findings: list[dict[str, Any]],
    *,
    width: int | None = None,
    color: bool = False,
    now: datetime | None = None,
) -> str:
    """The text screen for one ``status.json`` and the latest findings.

    ``width`` wraps the header and cuts every other line to that many visible characters
    (``None``: no limit).
    ``color`` adds ANSI codes: red for problems, yellow for warnings. ``now`` (aware)
    adds how long ago the monitor last wrote the status. Pure: no I/O, no clock.
    """
    ranks = _ranks(status)
    lines = [*_pack(_header(status, ranks, color, now), width), ""]
    if ranks:
        lines.extend(_table(_RANK_HEADER, [_rank_row(r) for r in ranks], _RANK_RIGHT, color))
    else:
        lines.append("no ranks observed yet")
    lines.append("")
    lines.extend(_health_lines(status, color))
    lines.append("")
    lines.extend(_finding_lines(findings, color))
    lines.extend(_ft_lines(status))
    return "\n".join(_clip(line, width) for line in lines) + "\n"


def _ft_lines(status: dict[str, Any]) -> list[str]:
    """Restarts and the timeouts in force with their sources (fault tolerance)."""
    out: list[str] = []
    restarts = status.get("restarts")
    if isinstance(restarts, list) and restarts:
        out += ["", f"Restarts: {len(restarts)}"]
        for r in restarts:
            if isinstance(r, dict):
                out.append(
                    f"  #{r.get('restart', '-')} {r.get('wall_time', '-')}  "
                    f"{r.get('cause') or '-'} rank {_s(r.get('rank'))}: {_s(r.get('message'))}"
                )
    stragglers = status.get("stragglers")
    if isinstance(stragglers, dict):
        out += [
            "",
            f"Stragglers (report {_s(stragglers.get('report'))}, best compute "
            f"{_s(stragglers.get('best_compute_ms'))} ms): {_s(stragglers.get('stragglers'))}",
        ]
        for label in ("worst", "best"):
            rows = stragglers.get(label) or []
            cells = [
                f"rank {_s(r.get('rank'))} rel {_s(r.get('relative'))} "
                f"ind {_s(r.get('individual'))}"
                for r in rows
                if isinstance(r, dict)
            ]
            out.append(f"  {label:<5}  " + ", ".join(cells))
    stop = status.get("stop_requested")
    if isinstance(stop, dict):
        out.append(
            f"  stop requested at step {_s(stop.get('stop_at_step'))}: {_s(stop.get('reason'))}"
        )
    timeouts = status.get("timeouts")
    if isinstance(timeouts, dict) and timeouts:
        out += ["", "Timeouts in force"]
        width = max(len(str(k)) for k in timeouts)
        for name, info in sorted(timeouts.items()):
            if isinstance(info, dict):
                out.append(
                    f"  {name:<{width}}  {_s(info.get('value')):>9} s  {_s(info.get('source'))}"
                )
    return out


def _s(value: Any) -> str:
    return "-" if value is None else str(value)


# --------------------------------------------------------------------------- command


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
    print(f"rankguard status: {message}", file=sys.stderr)
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
        print(note, file=sys.stderr)
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
