"""Exit 17's evidence: which ranks' first-run hardware was faulty.

Rank 0 writes ``rerun_verdict.json`` in the run directory (the launcher prints it) and,
under the Slurm script, the hosts to exclude into ``$RANKGUARD_EXCLUDE_FILE`` (the
script requeues the job with ``--exclude`` of them).
"""

from __future__ import annotations

import os
from pathlib import Path

from rankguard.rank.runenv import RunEnv, current
from rankguard.schema.jsontypes import JsonObject, JsonValue
from rankguard.schema.layout import RERUN_FAULTY_PREFIX, RERUN_VERDICT_FILE
from rankguard.util.fs import atomic_write_json, atomic_write_text

__all__ = ["read_verdict", "write_faulty_rank", "write_verdict"]


def write_verdict(iteration: int, culprits: list[JsonObject], env: RunEnv | None = None) -> None:
    faulty: list[JsonValue] = list(culprits)
    verdict: JsonObject = {"exit_code": 17, "iteration": iteration, "faulty": faulty}
    env = env or current()
    if env.run_dir:
        atomic_write_json(Path(env.run_dir) / RERUN_VERDICT_FILE, verdict)
    exclude = env.exclude_file
    if exclude:
        hosts = sorted({str(c["hostname"]) for c in culprits if c.get("hostname")})
        atomic_write_text(exclude, ",".join(hosts) + "\n")


def write_faulty_rank(rank: int, hardware: JsonObject, env: RunEnv | None = None) -> None:
    """A rank named faulty by exit 17, still on that hardware, says so in its own node's
    run directory: bad-node exclusion (``fault_tolerance.exclude_bad_nodes``) takes that
    node out of the job."""
    env = env or current()
    if env.run_dir:
        path = Path(env.run_dir) / f"{RERUN_FAULTY_PREFIX}{rank}.json"
        atomic_write_json(path, {"rank": rank, **hardware})


def read_verdict(run_dir: str | os.PathLike[str]) -> JsonObject | None:
    import json

    try:
        with open(Path(run_dir) / RERUN_VERDICT_FILE, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
