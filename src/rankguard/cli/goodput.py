"""``rankguard goodput RUN_DIR [--json]``: where the job's wall time went.

The ledger (:mod:`rankguard.goodput`) of the run directory: productive training, start-up,
recomputed work, checkpoint stall, evaluation, detection wait, recovery, rerun
validation, preemption drain and unknown, which sum to the wall time; the ETTR
(productive / wall); and what each interruption cost. Exit code 2 when the directory
holds no heartbeat of rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rankguard.goodput import PARTS, Ledger, ettr_text, read_ledger

__all__ = ["add_parser", "render"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``rankguard goodput`` on ``subparsers``."""
    p = subparsers.add_parser(
        "goodput",
        help="where the job's wall time went: productive training, start-up, restarts...",
        description="Split the run's wall time into productive training, start-up, "
        "recomputed work, checkpoint stall, evaluation, detection wait, recovery, rerun "
        "validation, preemption drain and unknown (they sum to the wall time), with the "
        "ETTR (productive / wall) and each interruption's cost. Exit code 2 when the "
        "directory holds no heartbeat of rank 0.",
    )
    p.add_argument("run_dir", type=Path, help="the run directory <log_dir>/heartbeat/<run_id>/")
    p.add_argument("--json", action="store_true", help="print the ledger as JSON")
    p.set_defaults(func=_main)


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


def render(ledger: Ledger, name: str) -> str:
    """The ledger as text."""
    wall = ledger.wall_s
    ettr = ettr_text(ledger.ettr)
    n = len(ledger.interruptions)
    lines = [
        f"goodput of {name}: wall {_s(wall)}, ETTR {ettr} ({ledger.attempts} attempt(s), "
        f"{n} interruption(s))"
    ]
    for part in PARTS:
        value = ledger.parts[part]
        share = f"{100 * value / wall:5.1f} %" if wall > 0 else "    -"
        lines.append(f"  {part.value:<18} {_s(value):>10}  {share}")
    for k, i in enumerate(ledger.interruptions, 1):
        where = f" at iteration {i.iteration}" if i.iteration is not None else " before a step"
        spent = ", ".join(f"{p.value} {_s(v)}" for p, v in i.parts.items() if v > 0)
        resumed = (
            f"; resumed after iteration {i.resumed_from}" if i.resumed_from is not None else ""
        )
        what = {
            "live_recovery": "live recovery in attempt",
            "inprocess": "in-process re-entry in attempt",
        }.get(i.kind, "attempt")
        lines.append(
            f"interruption {k}: {what} {i.attempt} ({i.cause or 'cause unknown'}){where}: "
            f"cost {_s(i.cost_s)} ({spent or 'no time of its own'}){resumed}"
        )
    return "\n".join(lines) + "\n"


def _main(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        sys.stderr.write(f"rankguard goodput: {run_dir}: no such run directory\n")
        return 2
    ledger = read_ledger(run_dir)
    if ledger is None:
        sys.stderr.write(f"rankguard goodput: {run_dir}: no heartbeat of rank 0 to read\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(ledger.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(render(ledger, Path(os.path.abspath(run_dir)).name))
    return 0
