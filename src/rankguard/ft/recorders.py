"""torch's two flight recorders, read as one trace.

torch keeps two flight recorders in a rank: NCCL's own (``ProcessGroupNCCL``'s, with CUDA
events; dumped by ``_dump_nccl_trace_json``, present only in a build with NCCL) and the
generic one that gloo records into (``_dump_fr_trace_json``, in every build). A job on
NCCL leaves the generic recorder with its CPU groups only (gloo sub-groups, a
``cpu:gloo,cuda:nccl`` group's CPU side) and its collectives in NCCL's: reading the
generic one alone would see no collective of an NCCL job.

:func:`trace_json` reads both and returns one JSON document of the same shape
(``entries``, ``pg_status``, ``pg_config``), read as data by the sampler
(:mod:`.collectives`) and the verdict (:mod:`.frverdict`). NCCL's groups keep their ids and
names. When NCCL's recorder holds anything (a group, an entry), the generic recorder's
groups are told apart from them: their ids and names get the suffix ``:cpu`` (each
backend of a group numbers its collectives on its own, and the two recorders number
their groups from 0 each, so a group id or name of one would otherwise stand for another
group, or the same group at another count). Every rank of a job reads the same
recorders, so every rank names a group alike. In a build without NCCL, or a job that made
no NCCL group, the generic recorder's document is returned as torch wrote it.

A recorder that raises is left out (the other is still read); none readable: None.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CPU_SUFFIX", "DUMPS", "available", "merge", "trace_json"]

NCCL_DUMP = "_dump_nccl_trace_json"
GENERIC_DUMP = "_dump_fr_trace_json"
DUMPS = (NCCL_DUMP, GENERIC_DUMP)
CPU_SUFFIX = ":cpu"


def _c10d() -> Any:
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    return c10d


def available() -> bool:
    """Whether this torch has a JSON dump of either recorder."""
    c10d = _c10d()
    return c10d is not None and any(hasattr(c10d, name) for name in DUMPS)


def _dump(fn: Any, include_collectives: bool, only_active: bool) -> bytes | None:
    if fn is None:
        return None
    try:
        data = fn(includeCollectives=include_collectives, onlyActive=only_active)
    except Exception:  # a recorder that cannot be read: the other one still is
        return None
    return data if isinstance(data, bytes) else str(data).encode()


def _holds_anything(doc: Any) -> bool:
    return isinstance(doc, dict) and any(doc.get(k) for k in ("pg_status", "pg_config", "entries"))


def trace_json(*, include_collectives: bool = True, only_active: bool = False) -> bytes | None:
    """Both recorders' dumps as one JSON document (see the module doc); None when this
    torch has neither dump or neither could be read."""
    c10d = _c10d()
    if c10d is None:
        return None
    generic = _dump(getattr(c10d, GENERIC_DUMP, None), include_collectives, only_active)
    nccl = _dump(getattr(c10d, NCCL_DUMP, None), include_collectives, only_active)
    if nccl is None:
        return generic
    nccl_doc = json.loads(nccl)
    if not _holds_anything(nccl_doc):
        return generic if generic is not None else nccl
    generic_doc = json.loads(generic) if generic is not None else None
    return json.dumps(merge(nccl_doc, generic_doc), separators=(",", ":")).encode()


def _cpu(name: Any) -> Any:
    return (
        f"{name}{CPU_SUFFIX}" if isinstance(name, (str, int)) and type(name) is not bool else name
    )


def merge(nccl: dict[str, Any], generic: dict[str, Any] | None) -> dict[str, Any]:
    """NCCL's recorder document with the generic recorder's groups added under
    ``<id>:cpu`` / ``<name>:cpu`` (see the module doc). Neither document is changed."""
    out = dict(nccl)
    if not isinstance(generic, dict):
        return out
    status = dict(nccl.get("pg_status") or {}) if isinstance(nccl.get("pg_status"), dict) else {}
    theirs = generic.get("pg_status")
    for key, st in (theirs if isinstance(theirs, dict) else {}).items():
        status[_cpu(key)] = st
    out["pg_status"] = status
    config = dict(nccl.get("pg_config") or {}) if isinstance(nccl.get("pg_config"), dict) else {}
    theirs = generic.get("pg_config")
    for name, cfg in (theirs if isinstance(theirs, dict) else {}).items():
        config[_cpu(name)] = cfg
    out["pg_config"] = config
    mine = nccl.get("entries")
    theirs = generic.get("entries")
    if isinstance(mine, list) or isinstance(theirs, list):
        entries = list(mine) if isinstance(mine, list) else []
        for e in theirs if isinstance(theirs, list) else []:
            if isinstance(e, dict):
                e = dict(e)
                e["pg_id"] = _cpu(e.get("pg_id"))
                pg = e.get("process_group")
                if isinstance(pg, list) and pg:
                    e["process_group"] = [_cpu(pg[0]), *pg[1:]]
            entries.append(e)
        out["entries"] = entries
    return out
