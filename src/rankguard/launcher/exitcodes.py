"""Exit codes of ``rankguard run`` (what a scheduler wrapper decides retries on), and
the rule that picks one. The codes are defined once, in :mod:`rankguard.schema.exits`
(the ranks use them too); this module re-exports them.

The table of codes, their meaning and whether to retry is in that module.

``EXIT_PREEMPTED`` wins over the others once the launcher acted on the exit signal
(``preemption.enable_exit_handler``): the job is going away, whatever happened during
the grace window (a rank killed at its end still leaves the previous checkpoint).
Without the exit handler a SIGTERM gives 143 (128+15) as before.

``EXIT_NODE_EXCLUDED`` (bad-node exclusion, :mod:`rankguard.launcher.exclusion`): this
node left the job before its ranks (re)started, or the nodes left cannot reach
``--nnodes`` MIN; the job is to be retried without the hosts of ``excluded_nodes.json``.

Codes 2 and 3 end the launch before any rank starts; :func:`exit_code` chooses among
the others from how the job ended (:class:`JobOutcome`). 16 and 17 are the ranks' own
exit codes (the rerun state machine), passed through: the launcher restarts the group
in the job on 16 while its restart budget lasts (a resume from the checkpoint), never
on 17.

``EXIT_WILL_REPEAT`` (18): the restart decision (:mod:`rankguard.ft.decide`) stopped the
job before its restart budget was spent, because a restart cannot help; with or without
``fault_tolerance.enable_ft_package`` (torch elastic's restarts are decided either way).
"""

from __future__ import annotations

from dataclasses import dataclass

from rankguard.schema import FindingType
from rankguard.schema.exits import (
    EXIT_CRASH,
    EXIT_FAILED,
    EXIT_HANG,
    EXIT_NO_RESTART,
    EXIT_NODE_EXCLUDED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_RERUN_RESUME,
    EXIT_RERUN_VALIDATION_FAILED,
    EXIT_STRAGGLER,
    EXIT_UNHEALTHY_GPU,
    EXIT_USAGE,
    EXIT_WILL_REPEAT,
    RERUN_CODES,
    RETRYABLE,
)

__all__ = [
    "EXIT_CRASH",
    "EXIT_FAILED",
    "EXIT_HANG",
    "EXIT_NODE_EXCLUDED",
    "EXIT_NO_RESTART",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_RERUN_RESUME",
    "EXIT_RERUN_VALIDATION_FAILED",
    "EXIT_STRAGGLER",
    "EXIT_UNHEALTHY_GPU",
    "EXIT_USAGE",
    "EXIT_WILL_REPEAT",
    "RERUN_CODES",
    "RETRYABLE",
    "JobOutcome",
    "exit_code",
    "is_hang",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOutcome:
    """How the job ended on this node: everything :func:`exit_code` looks at."""

    signal: int | None = None  # the signal that stopped the launcher
    failed: bool = False  # the worker group failed (restart budget spent, or aborted)
    fault_tolerance: bool = False  # fault_tolerance.enable_ft_package
    aborted: bool = False  # a finding whose action is ``abort`` ended the job
    cause: str | None = None  # finding type of the fault that ended the job, if any
    stop_at: int | None = None  # the step every rank was asked to stop at
    worker_exit: int | None = None  # the exit code of the failure that ended the group
    preempted: bool = False  # the launcher acted on the exit signal (preemption)
    excluded: bool = False  # bad-node exclusion: this node left, or too few nodes are left
    will_repeat: bool = False  # the restart decision stopped the job (ft.decide)


def is_hang(finding_type: str | None) -> bool:
    """Is ``finding_type`` (a ``findings.jsonl`` name) a hang?"""
    return (t := FindingType.parse(finding_type)) is not None and t.info.hang


def exit_code(outcome: JobOutcome) -> int:
    """The exit code of ``rankguard run`` for ``outcome`` (the table above)."""
    if outcome.preempted:
        return EXIT_PREEMPTED
    if outcome.signal is not None:
        return 128 + outcome.signal
    if outcome.excluded:
        return EXIT_NODE_EXCLUDED
    if outcome.failed:
        if outcome.worker_exit in RERUN_CODES:  # the ranks' own verdict (rerun)
            return outcome.worker_exit
        if outcome.will_repeat:
            return EXIT_WILL_REPEAT
        if not outcome.fault_tolerance:
            return EXIT_FAILED
        if outcome.aborted:
            return EXIT_NO_RESTART
        if is_hang(outcome.cause):
            return EXIT_HANG
        return EXIT_CRASH
    if outcome.stop_at is not None:
        return EXIT_STRAGGLER
    return EXIT_OK
