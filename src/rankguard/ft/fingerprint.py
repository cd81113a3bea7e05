"""The fingerprint of a failed attempt: what failed, where in the user's code, how the
process ended and where the training was, normalised so that the same fault in the
next attempt has the same fingerprint.

A fingerprint is built from what the run already recorded, nothing guessed from a log:
the exception and traceback of torch elastic's error file (``@record``), or the rank's
``process_end`` record (its exit code and error line) when there is no error file; the
exit code or signal the agent saw; the finding the launcher acted on; and the failing
rank's last phase and iteration from its heartbeat. Pure functions: the files are read
by :mod:`rankguard.ft.evidence`.

Normalisation keeps what names the fault and drops what changes from one attempt to the
next: hex addresses, paths, numbers (pids, ports, ranks, sizes, timestamps) become
``<addr>``, ``<path>``, ``<n>``; whitespace collapses; at most 200 characters. The user's
frames are the innermost three of the traceback outside Python itself, site-packages,
torch and rankguard, as ``file.py:line:function`` (the file's base name).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "Fingerprint",
    "normalise_message",
    "split_error",
    "user_frames",
]

MAX_MESSAGE = 200
MAX_FRAMES = 3

_ADDR = re.compile(r"\b0x[0-9a-fA-F]+\b")
_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?(?:\.{0,2}/|~/)?[\w.@+-]+(?:/[\w.@+-]+)+/?")
_NUM = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_SPACE = re.compile(r"\s+")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# ``pkg.mod.Name: message`` (a class name: capitalised, no spaces), or a bare name that
# says it is an exception (``KeyboardInterrupt``)
_EXC_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?P<type>[A-Z]\w*):\s?(?P<msg>.*)$|"
    r"^(?:[A-Za-z_]\w*\.)*(?P<bare>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))$"
)
# frames that are not the user's code: the interpreter, installed packages, torch, rankguard
_NOT_USER = re.compile(
    r"(^<frozen |^<string>$|/site-packages/|/dist-packages/|/lib/python\d+\.\d+/|"
    r"/torch/|/rankguard/)"
)


def normalise_message(text: str | None) -> str | None:
    """``text`` with addresses, paths and numbers replaced and whitespace collapsed."""
    if not text:
        return None
    out = _ADDR.sub("<addr>", text)
    out = _PATH.sub("<path>", out)
    out = _NUM.sub("<n>", out)
    out = _SPACE.sub(" ", out).strip()
    return out[:MAX_MESSAGE] or None


def split_error(text: str | None) -> tuple[str | None, str | None]:
    """``("ValueError", "bad value")`` from an error line or a traceback (its last line
    that names an exception, with the lines after it: the rest of a message of several
    lines, as torch's ``load_state_dict`` size mismatches); ``(None, text)`` when no
    exception is named."""
    if not text:
        return None, None
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        m = _EXC_LINE.match(lines[i])
        if m:
            message = " ".join([(m.group("msg") or "").strip(), *lines[i + 1 :]]).strip()
            return m.group("type") or m.group("bare"), message or None
    return None, lines[-1] if lines else None


def user_frames(callstack: str | None, limit: int = MAX_FRAMES) -> tuple[str, ...]:
    """The innermost ``limit`` frames of the user's code in a Python traceback,
    innermost last, as ``file.py:line:function``."""
    if not callstack:
        return ()
    frames = []
    for line in str(callstack).splitlines():
        m = _FRAME.match(line)
        if m is None or _NOT_USER.search(m.group("file")):
            continue
        frames.append(f"{os.path.basename(m.group('file'))}:{m.group('line')}:{m.group('func')}")
    return tuple(frames[-limit:]) if limit > 0 else ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprint:
    """One failed attempt, normalised. :attr:`key` is what two attempts compare on
    (exception, message, frames, exit code or signal, finding); the phase and the
    iteration say where the training was, and are compared on their own."""

    exc_type: str | None = None
    message: str | None = None  # normalised
    frames: tuple[str, ...] = ()  # the user's innermost frames, innermost last
    exit_code: int | None = None
    signal: str | None = None  # SIGKILL, ... when a signal ended the rank
    finding_type: str | None = None  # the finding the launcher acted on, if any
    phase: str | None = None
    iteration: int | None = None
    rank: int | None = None
    before_first_step: bool | None = None  # None: unknown (no heartbeat of the attempt)
    note: str | None = None  # raw evidence kept for the classifier (an OOM note, ...)
    raw_message: str | None = field(default=None, compare=False)  # before normalisation

    @property
    def key(self) -> str:
        """A short stable hash of what names the fault (not where it happened)."""
        parts = (
            self.exc_type or "",
            self.message or "",
            "|".join(self.frames),
            "" if self.exit_code is None else str(self.exit_code),
            self.signal or "",
            self.finding_type or "",
        )
        return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:12]

    def describe(self) -> str:
        """One line: ``ModuleNotFoundError: No module named 'x' at train.py:3:<module>
        (exit 1, phase setup, before the first step)``."""
        what = self.exc_type or (f"signal {self.signal}" if self.signal else None)
        if what is None:
            what = f"exit code {self.exit_code}" if self.exit_code is not None else "failure"
        text = f"{what}: {self.message}" if self.exc_type and self.message else what
        if self.frames:
            text += f" at {self.frames[-1]}"
        where = []
        if self.exc_type and self.exit_code is not None:
            where.append(f"exit {self.exit_code}")
        if self.finding_type:
            where.append(self.finding_type)
        if self.phase:
            where.append(f"phase {self.phase}")
        if self.before_first_step:
            where.append("before the first step")
        elif self.iteration is not None:
            where.append(f"iteration {self.iteration}")
        return f"{text} ({', '.join(where)})" if where else text

    def to_dict(self) -> JsonObject:
        return {
            "key": self.key,
            "exc_type": self.exc_type,
            "message": self.message,
            "frames": list(self.frames),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "finding_type": self.finding_type,
            "phase": self.phase,
            "iteration": self.iteration,
            "rank": self.rank,
            "before_first_step": self.before_first_step,
        }

    @classmethod
    def build(
        cls,
        *,
        error: str | None = None,
        callstack: str | None = None,
        exit_code: int | None = None,
        signal: str | None = None,
        finding_type: str | None = None,
        phase: str | None = None,
        iteration: int | None = None,
        rank: int | None = None,
        before_first_step: bool | None = None,
        note: str | None = None,
    ) -> Fingerprint:
        """From the raw evidence: ``error`` an error line or traceback, ``callstack``
        the traceback of the error file (frames, and the error when ``error`` is
        empty)."""
        exc_type, message = split_error(error or callstack)
        if exc_type is None and callstack:
            exc_type, message = split_error(callstack)
        return cls(
            exc_type=exc_type,
            message=normalise_message(message),
            frames=user_frames(callstack),
            exit_code=exit_code,
            signal=signal,
            finding_type=finding_type,
            phase=phase,
            iteration=iteration,
            rank=rank,
            before_first_step=before_first_step,
            note=note,
            raw_message=message,
        )
