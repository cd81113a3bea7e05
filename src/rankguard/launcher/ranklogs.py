"""Where each global rank's output went: torchrun's per-rank log files, indexed.

torch elastic's log specs (``--log-dir`` / ``--redirects`` / ``--tee``, or a
``--logs-specs`` plugin) decide every path, per local rank and attempt. Nothing maps a
*global* rank to its files afterwards, so :func:`recording_logs_specs` wraps the specs in
force (the public ``LogsSpecs`` interface, torch's decisions unchanged) and writes, at
each start of the workers, ``rank_logs_node_<k>.json`` in the run directory: for every
global rank its node, local rank, attempt and files. ``rankguard logs RUN_DIR --rank R``
reads those indexes (:func:`find_rank_logs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankguard.schema.coerce import as_int
from rankguard.schema.jsontypes import JsonInput, JsonObject, JsonValue
from rankguard.util.fs import atomic_write_json

__all__ = ["RankLogs", "find_rank_logs", "index_name", "read_index", "recording_logs_specs"]

_PREFIX = "rank_logs_node_"


def index_name(node: int) -> str:
    return f"{_PREFIX}{node}.json"


@dataclass(frozen=True, slots=True)
class RankLogs:
    """One global rank's files at its latest attempt (empty: the stream went to the
    console only)."""

    rank: int
    node: int
    local_rank: int
    attempt: int
    stdout: str = ""
    stderr: str = ""
    error_file: str = ""

    def to_dict(self) -> JsonObject:
        return {
            "rank": self.rank,
            "node": self.node,
            "local_rank": self.local_rank,
            "attempt": self.attempt,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error_file": self.error_file,
        }

    @classmethod
    def from_dict(cls, d: JsonInput) -> RankLogs:
        numbers = {key: as_int(d.get(key)) for key in ("rank", "node", "local_rank", "attempt")}
        bad = [key for key, value in numbers.items() if value is None]
        if bad:
            raise ValueError(f"rank log record: bad field: {bad[0]!r} is not an integer")
        return cls(
            rank=numbers["rank"] or 0,
            node=numbers["node"] or 0,
            local_rank=numbers["local_rank"] or 0,
            attempt=numbers["attempt"] or 0,
            stdout=str(d.get("stdout") or ""),
            stderr=str(d.get("stderr") or ""),
            error_file=str(d.get("error_file") or ""),
        )


def _file(path: str) -> str:
    return "" if path in ("", "/dev/null") else path


def _make_specs_class() -> type:
    from torch.distributed.elastic.multiprocessing.api import LogsSpecs

    class _Recording(LogsSpecs):
        def __init__(self, inner: Any, run_dir: Path) -> None:
            super().__init__(log_dir=inner.root_log_dir)
            self.inner = inner
            self.run_dir = Path(run_dir)

        @property
        def root_log_dir(self) -> str:
            return str(self.inner.root_log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            dest = self.inner.reify(envs)
            logs = []
            for local_rank, env in sorted(envs.items()):
                logs.append(
                    RankLogs(
                        rank=int(env.get("RANK", local_rank)),
                        node=int(env.get("GROUP_RANK", 0)),
                        local_rank=local_rank,
                        attempt=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
                        stdout=_file(dest.stdouts.get(local_rank, "")),
                        stderr=_file(dest.stderrs.get(local_rank, "")),
                        error_file=_file(dest.error_files.get(local_rank, "")),
                    )
                )
            if logs:
                records: list[JsonValue] = [log.to_dict() for log in logs]
                atomic_write_json(self.run_dir / index_name(logs[0].node), {"ranks": records})
            return dest

    return _Recording


def recording_logs_specs(inner: Any, run_dir: Path) -> Any:
    """``inner`` (torch elastic's ``LogsSpecs``), recording each start's files into
    ``run_dir`` (imports torch)."""
    return _make_specs_class()(inner, run_dir)


def read_index(path: Path) -> list[RankLogs]:
    """The records of one node's index (ValueError: not a rank log index)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
        raise ValueError(f"{path}: not a rank log index")
    return [RankLogs.from_dict(d) for d in doc["ranks"] if isinstance(d, dict)]


def find_rank_logs(run_dir: Path, rank: int) -> RankLogs | None:
    """Global rank ``rank``'s files from the indexes in ``run_dir`` (None: not found)."""
    for path in sorted(Path(run_dir).glob(f"{_PREFIX}*.json")):
        for rec in read_index(path):
            if rec.rank == rank:
                return rec
    return None
