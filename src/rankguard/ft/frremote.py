"""Flight-recorder traces of other nodes' ranks, through the rendezvous store.

Nodes share no filesystem: node k's ranks write their traces into node k's run
directory. On a hang node 0 asks every other node with live ranks at once
(``fr/request/<k>``: an id and the ranks; :meth:`RemoteTraces.ask`), then takes its own
ranks' traces; node k's relay has its ranks dump
(:func:`~rankguard.ft.flightrec.request_dumps`), reads the traces as data
(:func:`~rankguard.ft.flightrec.read_traces`: this user's regular files, bounded),
compacts them (:func:`compact_trace`: the groups' status and the newest entries without
their stack frames) and answers in ``fr/node/<k>`` under the same id
(:func:`answer_request`). Node 0 compares every node's traces together, under the job's
rank numbers: each trace is keyed by the rank its dumper was started with, the global
rank, never the node's local one.

Any client of the store can write these keys: node 0 keeps only an answer with the id it
asked, of at most :data:`MAX_REPLY` bytes, and of it only the ranks it asked that node
for, each a JSON object; nothing is unpickled. A node that does not answer in time
leaves its ranks out of the comparison (the verdict's ``ranks_read`` says which were
compared).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankguard.ft.flightrec import DUMP_DIR, read_traces, request_dumps
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import StoreKeys, note_request
from rankguard.schema.payloads import MAX_NODE_RANKS, PayloadError, load_json

__all__ = [
    "MAX_ENTRIES",
    "MAX_REPLY",
    "TRACE_DUMP_S",
    "RemoteTraces",
    "TraceWaiter",
    "answer_request",
    "compact_trace",
    "parse_reply",
    "parse_request",
]

logger = logging.getLogger(__name__)

TRACE_DUMP_S = 3.0  # how long a node waits for its ranks' traces
MAX_ENTRIES = 256  # newest entries of a rank's trace sent to node 0
MAX_REPLY = 8 << 20  # bytes of one node's answer
_MAX_ID = 64
_DROPPED = frozenset({"frames"})  # an entry's stack: the verdict does not read it

TraceWaiter = Callable[[], dict[int, JsonObject]]


def compact_trace(doc: JsonObject, max_entries: int = MAX_ENTRIES) -> JsonObject:
    """``doc`` with only its newest ``max_entries`` entries, each without its stack
    frames; everything else as it is (``pg_status``, ``pg_config``, the version)."""
    out: JsonObject = {k: v for k, v in doc.items() if k != "entries"}
    entries = doc.get("entries")
    if isinstance(entries, list):
        kept = entries[-max_entries:] if max_entries > 0 else []
        out["entries"] = [
            {k: v for k, v in e.items() if k not in _DROPPED} if isinstance(e, dict) else e
            for e in kept
        ]
    return out


def _encode(request_id: str, traces: dict[int, JsonObject], node_rank: int) -> bytes:
    """The answer, at most :data:`MAX_REPLY` bytes: fewer entries per trace until it
    fits, then the groups' status alone (no entries), then nothing."""
    limit = MAX_ENTRIES
    while True:
        body = {str(r): compact_trace(d, limit) for r, d in sorted(traces.items())}
        data = json.dumps({"id": request_id, "traces": body}, default=str).encode()
        if len(data) <= MAX_REPLY:
            return data
        if limit == 0:
            logger.warning(
                "rankguard relay: node %d's traces do not fit in %d bytes even without "
                "entries: none sent",
                node_rank,
                MAX_REPLY,
            )
            return json.dumps({"id": request_id, "traces": {}}).encode()
        limit //= 4


def parse_request(raw: bytes | str | None) -> tuple[str, list[int]]:
    """A trace request's id and ranks (:class:`PayloadError` when it is not one)."""
    doc = load_json(raw)
    if type(doc) is not dict:
        raise PayloadError("trace request: expected an object")
    rid, ranks = doc.get("id"), doc.get("ranks")
    if type(rid) is not str or not 0 < len(rid) <= _MAX_ID:
        raise PayloadError("trace request id: expected a short string")
    if type(ranks) is not list or len(ranks) > MAX_NODE_RANKS:
        raise PayloadError(f"trace request ranks: expected a list of at most {MAX_NODE_RANKS}")
    if not all(type(r) is int and r >= 0 for r in ranks):
        raise PayloadError("trace request ranks: expected ranks (integers >= 0)")
    return rid, sorted(set(ranks))


def parse_reply(raw: bytes | str | None, request_id: str, asked: set[int]) -> dict[int, JsonObject]:
    """The traces of an answer to ``request_id``, only the ranks in ``asked``;
    :class:`PayloadError` for another request's answer or one that is not an answer."""
    if raw is not None and len(raw) > MAX_REPLY:
        raise PayloadError(f"trace answer: {len(raw)} bytes (more than {MAX_REPLY})")
    doc = load_json(raw)
    if type(doc) is not dict or type(doc.get("traces")) is not dict:
        raise PayloadError("trace answer: expected an object with traces")
    if doc.get("id") != request_id:
        raise PayloadError("trace answer: of another request")
    out: dict[int, JsonObject] = {}
    for key, trace in doc["traces"].items():
        rank = int(key) if isinstance(key, str) and key.isdigit() and len(key) < 12 else None
        if rank is None or rank not in asked or type(trace) is not dict:
            raise PayloadError(f"trace answer: a trace of rank {str(key)[:20]} not asked for")
        out[rank] = trace
    return out


def answer_request(
    store: Any,
    keys: StoreKeys,
    node_rank: int,
    run_dir: Path,
    eligible: Callable[[list[int]], list[int]],
    *,
    timeout_s: float = TRACE_DUMP_S,
) -> bool:
    """Node k's relay: answer node 0's trace request, if one is waiting (True then).
    ``eligible`` keeps the asked ranks that are this node's and can answer (live, not
    stopped); their traces are taken as node 0 takes its own."""
    key = keys.traces_request(node_rank)
    if not store.check([key]):
        return False
    raw = store.get(key)
    store.delete_key(key)
    request_id, asked = parse_request(raw)
    ranks = eligible(asked)
    got = request_dumps(run_dir, ranks, timeout_s=timeout_s) if ranks else {}
    traces = read_traces(Path(run_dir) / DUMP_DIR, list(got))
    store.set(keys.traces(node_rank), _encode(request_id, traces, node_rank))
    logger.warning(
        "rankguard relay: flight-recorder traces of rank(s) %s sent to node 0 (asked: %s)",
        ", ".join(map(str, sorted(traces))) or "none",
        ", ".join(map(str, asked)) or "none",
    )
    return True


class RemoteTraces:
    """Node 0: ask other nodes for their ranks' traces and wait for the answers.

    ``timeout_s`` bounds the wait for all of them together: a relay looks for requests
    once per push interval and its ranks have a few seconds to dump."""

    def __init__(
        self,
        store: Any,
        run_id: str,
        *,
        timeout_s: float,
        poll_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.keys = StoreKeys(run_id)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.clock = clock
        self.ignored = 0  # answers that could not be used

    def ask(self, by_node: dict[int, list[int]]) -> TraceWaiter:
        """Send the requests now; the returned call waits for the answers (by rank)."""
        request_id = f"{os.getpid()}-{time.time_ns()}"
        asked = {n: sorted(set(r)) for n, r in by_node.items() if r and n != 0}
        for node, ranks in sorted(asked.items()):
            payload = json.dumps({"id": request_id, "ranks": ranks})
            self.store.set(self.keys.traces_request(node), payload)
            note_request(self.store, self.keys)  # the relays then look
        return lambda: self._wait(request_id, asked)

    def _wait(self, request_id: str, asked: dict[int, list[int]]) -> dict[int, JsonObject]:
        deadline = self.clock() + self.timeout_s
        pending = set(asked)
        out: dict[int, JsonObject] = {}
        while pending:
            for node in sorted(pending):
                got = self._answer(node, request_id, set(asked[node]))
                if got is not None:
                    out.update(got)
                    pending.discard(node)
            if not pending or self.clock() >= deadline:
                break
            time.sleep(self.poll_s)
        if pending:
            logger.warning(
                "rankguard: no flight-recorder traces from node(s) %s within %gs",
                ", ".join(map(str, sorted(pending))),
                self.timeout_s,
            )
        return out

    def _answer(self, node: int, request_id: str, asked: set[int]) -> dict[int, JsonObject] | None:
        key = self.keys.traces(node)
        try:
            if not self.store.check([key]):
                return None
            return parse_reply(self.store.get(key), request_id, asked)
        except PayloadError as exc:
            if "another request" in str(exc):  # an older answer: wait for ours
                return None
            self.ignored += 1
            logger.warning("rankguard: node %d's trace answer ignored: %s", node, exc)
            return {}  # that node's answer: none usable
        except Exception as exc:  # the store: counted, the wait goes on
            self.ignored += 1
            logger.warning("rankguard: reading node %d's traces failed: %s", node, exc)
            return None
