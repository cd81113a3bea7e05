"""Restart or stop: the decision after each failed attempt of the worker group.

torch elastic restarts a failed group while its budget (``--max-restarts``) lasts,
whatever failed. An ``ImportError``, a missing data file or a shape mismatch fails the
same way every time: each restart is a full start-up spent for nothing, and a job retry
after it spends more. :class:`RestartDecider` looks at each failure's
:class:`~rankguard.ft.fingerprint.Fingerprint` and the attempts before it, and stops the
job (exit ``EXIT_DETERMINISTIC_FAILURE``, not retried) when a restart cannot help:

1. ``deterministic_at_startup``: the failure came before the first training step and is
   of a deterministic kind (:func:`classify`): ``ImportError``/``ModuleNotFoundError``,
   ``SyntaxError``, ``FileNotFoundError``, argument and configuration errors, a shape
   mismatch, a usage exit (code 2, argparse's) without an exception;
2. ``repeated_at_same_iteration``: the previous attempt failed with the same fingerprint
   at the same iteration (both before the first step counts as the same place);
3. ``no_progress``: this is the ``max_no_progress_restarts``-th attempt in a row that
   did not get past the highest iteration reached before it.

Transient failures always restart (the budget still bounds them): a rank killed by a
signal (SIGKILL, an OOM kill), a finding the launcher acted on (a hang, a lost peer, a
GPU health failure, a rerun of a NaN), a collective broken by a peer that went away,
network, NCCL, CUDA and XID errors. They still count for the no-progress rule but are
never stopped by it: elsewhere (a job retry on other nodes) they may well pass.

Where the heartbeat says nothing (heartbeats off, or no record of the attempt) the
first step is unknown: rule 1 does not apply and rule 2 needs both iterations known.

Lifecycle of one decision: the agent sees the group fail, the decider returns a
:class:`Decision` (``RESTART`` or ``STOP``), the agent restarts the group or ends it;
each decision is one ``restarts.jsonl`` line (the restart's own line, or a ``stop``
line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from rankguard.ft.fingerprint import Fingerprint
from rankguard.schema.exits import RERUN_CODES
from rankguard.schema.findings import FindingType
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "DETERMINISTIC_TYPES",
    "Decision",
    "FailureKind",
    "RestartDecider",
    "Rule",
    "Verdict",
    "classify",
]

DETERMINISTIC_TYPES = frozenset(
    {
        "ImportError",
        "ModuleNotFoundError",
        "SyntaxError",
        "IndentationError",
        "TabError",
        "NameError",
        "FileNotFoundError",
        "NotADirectoryError",
        "IsADirectoryError",
        "ArgumentError",
        "ArgumentTypeError",
        "ValueError",
        "TypeError",
        "KeyError",
        "AttributeError",
        "ConfigError",
        "ConfigurationError",
        "ConfigAttributeError",
        "ConfigKeyError",
        "ConfigTypeError",
        "MissingMandatoryValue",
        "ValidationError",
        "IndexError",
        "JSONDecodeError",
        "TOMLDecodeError",
        "YAMLError",
        "ScannerError",
        "ParserError",
        "ComposerError",
        "ConstructorError",
    }
)
"""Exceptions that fail the same way at every start-up (argument and configuration
errors included: argparse's, omegaconf's, pydantic's; a configuration file that does
not parse: JSON, TOML, PyYAML's errors; an index out of range, as an embedding's)."""

_SHAPE = re.compile(
    r"shape mismatch|size mismatch|shapes? .{0,40}cannot be (?:multiplied|broadcast)|"
    r"must match the size of tensor|is invalid for input of size|"
    r"sizes of tensors must match|"
    r"(?:shape|size)s? (?:do(?:es)? not|don't) match|expected .{0,60}shape",
    re.IGNORECASE,
)
_TRANSIENT_TEXT = re.compile(
    r"NCCL|CUDA error|cudaError|\bXid\b|ECC error|uncorrectable|GPU is lost|"
    r"fell off the bus|DistNetworkError|DistStoreError|DistBackendError|"
    r"connection (?:closed|reset|refused)|broken pipe|remote process exited|"
    r"timed? ?out|ECONNRESET|watchdog",
    re.IGNORECASE,
)
_TRANSIENT_TYPES = frozenset(
    {
        "TimeoutError",
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "DistError",
        "DistNetworkError",
        "DistStoreError",
        "DistBackendError",
        "ChildFailedError",
        "KeyboardInterrupt",
    }
)
_USAGE_EXIT = 2  # argparse's exit code for a bad command line
# findings of the monitor that name a crash, not a cause of their own
_CRASH_FINDINGS = frozenset(
    {FindingType.PROCESS_EXITED.value, FindingType.WORKER_FAILED.value, None}
)


class FailureKind(str, Enum):
    """What kind of failure a fingerprint shows (:func:`classify`)."""

    DETERMINISTIC = "deterministic"  # fails the same way at every start
    TRANSIENT = "transient"  # infrastructure: may well pass next time
    OTHER = "other"  # an exception of the user's code, not known to repeat


class Verdict(str, Enum):
    RESTART = "restart"
    STOP = "stop"


class Rule(str, Enum):
    """Why a decision was taken."""

    RESTART = "restart"  # no rule stops it
    TRANSIENT = "transient"  # a transient failure: restarts whatever came before
    DETERMINISTIC_AT_STARTUP = "deterministic_at_startup"
    REPEATED_AT_SAME_ITERATION = "repeated_at_same_iteration"
    NO_PROGRESS = "no_progress"


def classify(fp: Fingerprint) -> tuple[FailureKind, str]:
    """The kind of failure ``fp`` shows, and why in a few words."""
    if fp.signal or (fp.exit_code is not None and fp.exit_code < 0):
        return FailureKind.TRANSIENT, f"killed by {fp.signal or f'signal {-(fp.exit_code or 0)}'}"
    if fp.finding_type not in _CRASH_FINDINGS:
        return FailureKind.TRANSIENT, f"finding {fp.finding_type}"
    if fp.exit_code in RERUN_CODES:
        return FailureKind.TRANSIENT, f"the rerun state machine's exit {fp.exit_code}"
    if fp.exc_type in _TRANSIENT_TYPES:
        return FailureKind.TRANSIENT, fp.exc_type
    if fp.exc_type in DETERMINISTIC_TYPES:
        return FailureKind.DETERMINISTIC, fp.exc_type
    if _TRANSIENT_TEXT.search(f"{fp.raw_message or ''} {fp.note or ''}"):
        return FailureKind.TRANSIENT, "a lost peer, network, NCCL or GPU error"
    if fp.exc_type == "RuntimeError" and _SHAPE.search(fp.raw_message or ""):
        return FailureKind.DETERMINISTIC, "a shape mismatch"
    if fp.exc_type is None and fp.exit_code == _USAGE_EXIT:
        return FailureKind.DETERMINISTIC, "a usage error (exit 2)"
    return FailureKind.OTHER, fp.exc_type or f"exit code {fp.exit_code}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One decision after one failed attempt."""

    verdict: Verdict
    rule: Rule
    kind: FailureKind
    fingerprint: Fingerprint
    attempt: int  # 1 for the first attempt of the launch
    no_progress: int  # attempts in a row (this one included) without progress
    why: str  # a few words

    @property
    def stop(self) -> bool:
        return self.verdict is Verdict.STOP

    def line(self) -> str:
        """The one line the launcher says when it stops the job."""
        rules = {
            Rule.DETERMINISTIC_AT_STARTUP: f"{self.why} before the first step: it fails "
            "the same way at every start",
            Rule.REPEATED_AT_SAME_ITERATION: "the same failure as the previous attempt, "
            "at the same place",
            Rule.NO_PROGRESS: f"{self.no_progress} attempts in a row made no progress",
        }
        why = rules.get(self.rule, self.why)
        return (
            f"stop, no restart: {why}: fingerprint {self.fingerprint.key} "
            f"{self.fingerprint.describe()}"
        )

    def to_dict(self) -> JsonObject:
        return {
            "decision": self.verdict.value,
            "rule": self.rule.value,
            "failure_kind": self.kind.value,
            "attempt": self.attempt,
            "no_progress_attempts": self.no_progress,
            "fingerprint": self.fingerprint.to_dict(),
        }


class RestartDecider:
    """The decisions of one launch, attempt after attempt (see the module doc).

    ``max_no_progress`` (``fault_tolerance.max_no_progress_restarts``): this many
    attempts in a row without progress stop the job; 0 turns that rule off.
    ``repeats``: the repeat and no-progress rules apply; off while bad-node exclusion
    counts a node's restarts (``exclude_after_restarts``): a crash that repeats on one
    node is then that node's to answer for, and exclusion acts on it."""

    def __init__(self, max_no_progress: int = 3, *, repeats: bool = True) -> None:
        if max_no_progress < 0:
            raise ValueError(f"max_no_progress_restarts: must be >= 0, got {max_no_progress}")
        self.max_no_progress = max_no_progress
        self.repeats = repeats
        self.attempt = 0
        self.best_iteration: int | None = None  # highest iteration any attempt reached
        self.no_progress = 0
        self.previous: Fingerprint | None = None
        self.decisions: list[Decision] = []

    def decide(self, fp: Fingerprint, reached: int | None) -> Decision:
        """Decide after an attempt failed with ``fp``; ``reached`` is the highest
        iteration the attempt's ranks reported (None: no step, or unknown)."""
        self.attempt += 1
        progressed = reached is not None and (
            self.best_iteration is None or reached > self.best_iteration
        )
        if progressed:
            self.best_iteration = reached
            self.no_progress = 0
        else:
            self.no_progress += 1
        kind, why = classify(fp)
        previous, self.previous = self.previous, fp
        verdict, rule = Verdict.RESTART, Rule.RESTART
        if kind is FailureKind.TRANSIENT:
            rule = Rule.TRANSIENT
        elif kind is FailureKind.DETERMINISTIC and fp.before_first_step:
            verdict, rule = Verdict.STOP, Rule.DETERMINISTIC_AT_STARTUP
        elif not self.repeats:
            pass
        elif previous is not None and _same_place(previous, fp):
            verdict, rule = Verdict.STOP, Rule.REPEATED_AT_SAME_ITERATION
        elif self.max_no_progress and self.no_progress >= self.max_no_progress:
            verdict, rule = Verdict.STOP, Rule.NO_PROGRESS
        decision = Decision(
            verdict=verdict,
            rule=rule,
            kind=kind,
            fingerprint=fp,
            attempt=self.attempt,
            no_progress=self.no_progress,
            why=why,
        )
        self.decisions.append(decision)
        return decision


def _same_place(a: Fingerprint, b: Fingerprint) -> bool:
    """The same fingerprint at the same iteration (before the first step both times
    counts as the same place; an unknown place never matches)."""
    if a.key != b.key:
        return False
    if a.before_first_step and b.before_first_step:
        return True
    return a.iteration is not None and a.iteration == b.iteration
