"""``rankguard logs RUN_DIR --rank R``: one global rank's output, after the fact.

torchrun writes a rank's output into per-rank files only when asked (``--redirects`` /
``--tee``, or rankguard's ``--rank-prefix``), under local-rank and attempt directories
that do not say which global rank they were. The launcher indexes them in the run
directory (:mod:`rankguard.launcher.ranklogs`); this command reads the index and prints
the rank's stdout and/or stderr, or says why it cannot (not captured, on another node).
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from rankguard.launcher.ranklogs import find_rank_logs

__all__ = ["add_parser", "show_logs"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``rankguard logs`` on ``subparsers``."""
    p = subparsers.add_parser(
        "logs",
        help="print one global rank's output (torchrun's per-rank log files)",
        description="Print the output of global rank R of a run, from the per-rank files "
        "torchrun wrote (--redirects/--tee, or --rank-prefix). Exit code 2 when the rank's "
        "output was not captured or cannot be read here.",
    )
    p.add_argument("run_dir", type=Path, help="the run directory <log_dir>/heartbeat/<run_id>/")
    p.add_argument("--rank", type=int, required=True, help="the global rank")
    p.add_argument(
        "--stream",
        choices=["both", "stdout", "stderr"],
        default="both",
        help="which stream to print (default both, stdout first)",
    )
    p.set_defaults(func=_main)


def show_logs(run_dir: Path, rank: int, stream: str = "both") -> tuple[int, str]:
    """The exit code and the text to print for ``rankguard logs``."""
    if not run_dir.is_dir():
        return 2, f"rankguard logs: {run_dir}: no such run directory\n"
    try:
        rec = find_rank_logs(run_dir, rank)
    except ValueError as exc:
        return 2, f"rankguard logs: {exc}\n"
    if rec is None:
        return 2, (
            f"rankguard logs: rank {rank} is in no log index of {run_dir} (not started, "
            "or its node's index is on that node's disk)\n"
        )
    wanted = ["stdout", "stderr"] if stream == "both" else [stream]
    paths = [(name, getattr(rec, name)) for name in wanted]
    if not any(path for _, path in paths):
        return 2, (
            f"rankguard logs: rank {rank}'s {stream} went to the console only: run with "
            "--tee 3 (console and files), --redirects 3 or --rank-prefix to keep it\n"
        )
    out: list[str] = []
    for name, path in paths:
        if not path:
            continue
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return 2, (
                f"rankguard logs: rank {rank} (node {rec.node}) {name}: {path}: "
                f"{exc.strerror} (on host {socket.gethostname()}; the file is on its node)\n"
            )
        if stream == "both":
            out.append(f"==> rank {rank} {name} (node {rec.node}, attempt {rec.attempt}) <==\n")
        out.append(text if text.endswith("\n") or not text else text + "\n")
    return 0, "".join(out)


def _main(args: argparse.Namespace) -> int:
    code, text = show_logs(args.run_dir, args.rank, args.stream)
    (sys.stdout if code == 0 else sys.stderr).write(text)
    return code
