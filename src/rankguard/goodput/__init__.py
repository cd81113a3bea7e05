"""Goodput: the job's wall time accounted for, part by part (:mod:`.ledger`), from the
events its run directory recorded (:mod:`.rundir`)."""

from rankguard.goodput.ledger import PARTS, Attempt, Interruption, Ledger, Part, build_ledger
from rankguard.goodput.rundir import read_attempts, read_ledger

__all__ = [
    "PARTS",
    "Attempt",
    "Interruption",
    "Ledger",
    "Part",
    "build_ledger",
    "read_attempts",
    "read_ledger",
]
