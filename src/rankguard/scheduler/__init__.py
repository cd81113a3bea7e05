"""The schedulers a job runs under, behind one interface (:class:`Scheduler`): plain,
Slurm and Kubeflow, in :data:`SCHEDULERS`. Nothing outside this package tests a
scheduler's name: the launcher's exit code goes through the scheduler the ``exit_codes``
setting names (:func:`for_exit_codes`), bad-node exclusion's hints and their lines are
every scheduler's (:func:`exclusion_hints`, :func:`exclusion_hint_lines`,
:func:`exclusion_hint_text`), and :mod:`rankguard.rank.runenv` reads the job id from the
variables the schedulers name (:data:`JOB_ID_VARIABLES`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rankguard.scheduler.base import Scheduler
from rankguard.scheduler.kubeflow import KUBEFLOW
from rankguard.scheduler.plain import PLAIN
from rankguard.scheduler.slurm import SLURM
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "EXIT_CODE_TABLES",
    "JOB_ID_VARIABLES",
    "SCHEDULERS",
    "Scheduler",
    "exclusion_hint_lines",
    "exclusion_hint_text",
    "exclusion_hints",
    "for_exit_codes",
]

#: The registry. A new scheduler is a module here and one more entry.
SCHEDULERS: tuple[Scheduler, ...] = (PLAIN, SLURM, KUBEFLOW)

#: The values of the ``exit_codes`` setting: each scheduler's table that has one.
EXIT_CODE_TABLES: tuple[str, ...] = tuple(
    s.exit_code_table for s in SCHEDULERS if s.exit_code_table is not None
)

#: Every variable a scheduler names its job by, in the order they are tried.
JOB_ID_VARIABLES: tuple[str, ...] = tuple(v for s in SCHEDULERS for v in s.job_id_variables)


def for_exit_codes(table: str) -> Scheduler:
    """The scheduler whose exit-code table the ``exit_codes`` setting names."""
    for scheduler in SCHEDULERS:
        if scheduler.exit_code_table == table:
            return scheduler
    names = " or ".join(repr(t) for t in EXIT_CODE_TABLES)
    raise ValueError(f"exit_codes: must be {names}, got {table!r}")


def exclusion_hints(hosts: Iterable[str]) -> JsonObject:
    """Every scheduler's way to leave ``hosts`` out (``excluded_nodes.json``, the
    finding), each host one quoted shell word: a host name that is not one (it came from
    the store) stays one argument, never a command of its own."""
    listed = sorted(set(hosts))
    out: JsonObject = {}
    for scheduler in SCHEDULERS:
        out.update(scheduler.exclusion_hint(listed))
    return out


def exclusion_hint_lines(data: Mapping[str, Any]) -> list[str]:
    """What ``rankguard status`` says of the schedulers' hints in ``data``."""
    return [line for s in SCHEDULERS for line in s.hint_lines(data)]


def exclusion_hint_text(hint: Mapping[str, Any]) -> str:
    """The schedulers' parts of the launcher's line naming the excluded hosts."""
    return "; ".join(t for s in SCHEDULERS if (t := s.hint_text(hint)) is not None)
