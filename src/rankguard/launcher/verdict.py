"""The launcher's verdict on a failed run: what torchrun prints (torch elastic's own
``ChildFailedError`` block, :func:`failure_summary`), then one root cause that agrees with
the findings, or says why not (:func:`root_cause_lines`).

The agent knows this node's exit codes and error files; node 0's monitor knows every
node's ranks and the order they failed in; fault tolerance knows what it killed. The
root cause is the finding fault tolerance acted on (its SIGKILL is not the cause), else
the failure the monitor saw first where this node's first failed worker is another rank
or a peer's echo ("Connection closed by peer"), else the agent's first failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankguard.ft.failure import WorkerFailure
from rankguard.monitor.rules import peer_failure
from rankguard.schema.coerce import as_dict, as_list
from rankguard.schema.findings import FindingType
from rankguard.schema.jsontypes import JsonInput
from rankguard.util.textsafe import safe_text

__all__ = ["failure_summary", "root_cause_lines"]


def failure_summary(name: str, failures: dict[int, Any]) -> str | None:
    """What torchrun prints when the worker group failed: torch elastic's own
    ``ChildFailedError`` block (time, host, rank, local rank, exit code, error file and
    the traceback from it) for ``failures`` (a ``RunResult``'s), the first line as the
    exception's name prints it; None without failures."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not failures:
        return None
    error = ChildFailedError(name=name, failures=failures)
    return safe_text(
        f"{type(error).__module__}.{type(error).__name__}: \n{error}", keep_newlines=True
    )


def _agent_words(root: WorkerFailure) -> str:
    sig = f" ({root.signal})" if root.signal else ""
    last = ((root.error or "-").strip().splitlines() or ["-"])[-1][:300]
    return f"rank {root.rank} (pid {root.pid}) exited with code {root.exit_code}{sig}: {last}"


def _first_cause(findings: Sequence[JsonInput]) -> JsonInput | None:
    """The first finding of an error (not a warning) that names a rank: the failure the
    monitor saw first, on any node."""
    for f in findings:
        ftype = FindingType.parse(f.get("finding_type"))
        if (
            ftype is not None
            and ftype.info.severity == "error"
            and ftype is not FindingType.WORKER_FAILED
            and isinstance(f.get("rank"), int)
        ):
            return f
    return None


def _echo_only(f: JsonInput) -> bool:
    """A rank's exit whose error says a peer went away, with no peer seen leaving."""
    exit_info = as_dict(f.get("exit")) or {}
    return (
        f.get("finding_type") == FindingType.PROCESS_EXITED.value
        and peer_failure(exit_info.get("error"))
        and not exit_info.get("peers_ended_first")
    )


def _finding_words(f: JsonInput) -> str:
    early = as_list((as_dict(f.get("exit")) or {}).get("peers_ended_first"))
    if early and f.get("finding_type") == FindingType.PROCESS_EXITED.value:
        ranks = f"rank {early[0]}" if len(early) == 1 else f"ranks {', '.join(map(str, early))}"
        return (
            f"{ranks} left the job early (exited cleanly while rank {f['rank']} still ran "
            f"collectives with it); rank {f['rank']} then failed: {_last_error_line(f)}"
        )
    message = str(f.get("message") or "")
    who = f"rank {f['rank']} (pid {f.get('pid')} on {f.get('hostname')})"
    if message.startswith(who + ": "):
        return f"{who}: {f.get('finding_type')}: {message[len(who) + 2 :]}"
    return f"rank {f['rank']}: {f.get('finding_type')}: {message}"


def _last_error_line(f: JsonInput) -> str:
    error = str((as_dict(f.get("exit")) or {}).get("error") or "-").strip()
    return (error.splitlines() or ["-"])[-1][:300]


def root_cause_lines(
    root: WorkerFailure | None,
    acted: JsonInput | None,
    findings: Sequence[JsonInput],
    *,
    monitored: bool = True,
    stopped: str | None = None,
    killed_on_request: bool = False,
) -> list[str]:
    """The launcher's verdict on a failed run, agreeing with the findings.

    ``root``: this node's agent's first failure (exit codes, error files); ``acted``: a
    finding the launcher acted on (fault tolerance killed its rank: that kill's exit
    code is rankguard's doing, the finding is the cause); ``findings``: the monitor's
    (node 0: every node's ranks), in the order found; ``monitored``: this node runs
    the monitor (else the findings are on node 0); ``stopped``: why a launcher stopped
    its ranks, as the monitor heard it (another node's SIGTERM); ``killed_on_request``:
    ``root``'s rank was killed by this node's relay for node 0's fault tolerance (the
    finding is on node 0). The root cause is the finding acted on, else the failure the
    monitor saw first when the agent's first failure is another rank or a peer's echo
    ("Connection closed by peer"), else the agent's first failure; a second line says
    why another rank's exit is not the cause."""
    if acted is not None and acted.get("finding_type") != FindingType.WORKER_FAILED.value:
        lines = [f"root cause: {_finding_words(acted)}"]
        if root is not None and root.rank == acted.get("rank") and root.signal:
            lines.append(
                f"  rank {root.rank}'s exit code {root.exit_code} ({root.signal}) "
                "is fault tolerance's kill for that finding, not the cause"
            )
        elif root is not None:
            lines.append(f"  this node's first failed worker, a consequence: {_agent_words(root)}")
        return lines
    if root is not None and killed_on_request and not monitored:
        return [
            f"root cause: a finding on node 0 (its findings name it): {_agent_words(root)}: "
            "fault tolerance killed it on node 0's request (that kill's exit code, not the "
            "cause)"
        ]
    first = _first_cause(findings)
    if first is None and stopped is not None:
        lines = [f"root cause: no rank failed: the job was stopped ({stopped})"]
        if root is not None:
            lines.append(f"  this node's first failed worker, a consequence: {_agent_words(root)}")
        return lines
    if root is None:
        return [f"root cause: {_finding_words(first)}"] if first is not None else []
    echo = peer_failure(root.error)
    if first is not None and _echo_only(first):
        first = None  # the monitor saw only the echo too: no cause found
    if first is not None and (first.get("rank") != root.rank or echo):
        lines = [f"root cause: {_finding_words(first)}"]
        if first.get("rank") != root.rank:
            lines.append(f"  this node's first failed worker, a consequence: {_agent_words(root)}")
        return lines
    if echo and monitored:  # the monitor saw no rank fail before it
        return [
            f"root cause: not found: {_agent_words(root)}: its peer went away, and no "
            "rank was seen failing before it"
        ]
    if echo:
        return [
            f"root cause: not on this node: {_agent_words(root)}: its peer went away; "
            "node 0's findings name the rank that failed first"
        ]
    return [f"root cause: {_agent_words(root)}"]
