"""Goodput: the job's wall time accounted for, part by part (:mod:`.ledger`), from the
events its run directory recorded (:mod:`.rundir`), kept current in status.json while the job runs
(:mod:`.status`)."""

from rankguard.goodput.ledger import (
    PARTS,
    Attempt,
    Interruption,
    Ledger,
    LiveRecovery,
    Part,
    build_ledger,
    ettr_text,
)
from rankguard.goodput.rundir import read_attempts, read_ledger
from rankguard.goodput.status import GoodputStatus, goodput_block

__all__ = [
    "PARTS",
    "Attempt",
    "GoodputStatus",
    "Interruption",
    "Ledger",
    "LiveRecovery",
    "Part",
    "build_ledger",
    "ettr_text",
    "goodput_block",
    "read_attempts",
    "read_ledger",
]
