"""What the relays put in the store, typed and validated before node 0 uses any of it.

Any client of the rendezvous store can write a relay's keys, so node 0 parses every
value into one of these objects first and drops what does not fit (counted by the
caller): a value that is not JSON, nested too deep for the parser (``RecursionError``),
of the wrong shape, or past a size bound. Nothing of a payload is kept (not its
generation, not its health snapshot) unless all of it parses.

- :class:`NodeBase`: ``hb/node/<k>``, a node's full records, health, disk, shutdown and
  root cause;
- :class:`Tick`: ``hb/tick/<k>``, the moving fields of each local rank and the disk;
- :func:`check_health`: a GPU health snapshot (relayed, or the node's own file);
- :func:`parse_kill_request`: ``kill/node/<k>``, deduplicated and capped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rankguard.schema.jsontypes import JsonObject
from rankguard.util.disk import DiskState

__all__ = [
    "MAX_KILL_TARGETS",
    "MAX_NODE_RANKS",
    "KillTarget",
    "NodeBase",
    "PayloadError",
    "Tick",
    "check_health",
    "load_json",
    "parse_kill_request",
]

#: Most records (or tick rows) one node's payload may carry.
MAX_NODE_RANKS = 1 << 12
#: Most distinct targets one kill request may name (more are dropped, with a count).
MAX_KILL_TARGETS = 256
_MAX_GPUS = 1024
_MAX_TEXT = 4096
_MAX_EPOCH = 128


class PayloadError(ValueError):
    """A store value that cannot be used; the message says what is wrong."""


# ``json.loads``'s own scanner, called directly on the payloads relays write (node 0
# parses one tick per relay push): ``json.loads`` spends about 2 µs of Python around it
# (the bytes' encoding guessed, the text decoded, whitespace matched twice).
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def load_json(raw: bytes | str | None) -> Any:
    """``raw`` parsed; :class:`PayloadError` for anything the parser refuses, a
    nesting too deep for it included."""
    if type(raw) is bytes and raw[:2] == b'{"':
        # UTF-8 (``json.loads`` takes bytes that start so for UTF-8) holding one
        # object and nothing after it: what ``json.loads`` returns. Anything else
        # (whitespace around it, an error) is left to ``json.loads`` itself.
        try:
            text = raw.decode("utf-8", "surrogatepass")
            value, end = _scan_once(text, 0)
        except (RecursionError, ValueError, StopIteration):
            pass
        else:
            if end == len(text):
                return value
    if raw is None:
        raise PayloadError("no value")
    try:
        return json.loads(raw)
    except RecursionError:
        raise PayloadError("nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise PayloadError(f"not JSON ({type(exc).__name__})") from None


def _text(d: JsonObject, key: str, *, limit: int = _MAX_TEXT) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if type(v) is not str or len(v) > limit:
        raise PayloadError(f"{key}: expected a string of at most {limit} characters")
    return v


def _generation(d: JsonObject) -> tuple[str | int, int]:
    epoch, gen = d.get("epoch"), d.get("gen")
    if not (type(epoch) is int or (type(epoch) is str and len(epoch) <= _MAX_EPOCH)):
        raise PayloadError("epoch: expected a short string or an integer")
    if type(gen) is not int or gen < 0:
        raise PayloadError("gen: expected an integer >= 0")
    return epoch, gen


def _list(d: JsonObject, key: str, limit: int) -> list[Any]:
    v = d.get(key)
    if v is None:
        return []
    if type(v) is not list:
        raise PayloadError(f"{key}: expected a list, got {type(v).__name__}")
    if len(v) > limit:
        raise PayloadError(f"{key}: {len(v)} entries, more than {limit}")
    return v


def check_health(snapshot: Any) -> JsonObject:
    """A GPU health snapshot with the shape every reader relies on (an object; its
    ``gpus`` a list of objects; its texts strings); :class:`PayloadError` otherwise."""
    if type(snapshot) is not dict:
        raise PayloadError(f"health: expected an object, got {type(snapshot).__name__}")
    try:
        gpus = _list(snapshot, "gpus", _MAX_GPUS)
        if any(type(g) is not dict for g in gpus):
            raise PayloadError("gpus: every entry must be an object")
        for key in ("status", "source", "hostname", "error", "collected_wall_time"):
            _text(snapshot, key)
    except PayloadError as exc:
        raise PayloadError(f"health.{exc}") from None
    return snapshot


@dataclass(frozen=True, slots=True)
class NodeBase:
    """``hb/node/<k>``: the full records of node k's ranks (dicts, each validated by
    the caller as a record), its GPU health, disk, shutdown and root cause."""

    epoch: str | int
    gen: int
    records: list[JsonObject]
    health: JsonObject | None = None
    disk: DiskState | None = None
    shutdown: str | None = None
    root_cause: tuple[int, int | None] | None = None

    @property
    def key(self) -> tuple[str | int, int]:
        return self.epoch, self.gen

    @classmethod
    def parse(cls, raw: bytes | str | None) -> NodeBase:
        d = load_json(raw)
        if type(d) is not dict:
            raise PayloadError(f"node records: expected an object, got {type(d).__name__}")
        epoch, gen = _generation(d)
        records = _list(d, "records", MAX_NODE_RANKS)
        if any(type(r) is not dict for r in records):
            raise PayloadError("records: every entry must be an object")
        health = d.get("health")
        root = d.get("root_cause")
        cause: tuple[int, int | None] | None = None
        if root is not None:
            if not (
                type(root) is list
                and len(root) == 2
                and type(root[0]) is int
                and (root[1] is None or type(root[1]) is int)
            ):
                raise PayloadError("root_cause: expected [rank, pid or null]")
            cause = (root[0], root[1])
        return cls(
            epoch,
            gen,
            records,
            health=None if health is None else check_health(health),
            disk=DiskState.from_dict(d.get("disk")),
            shutdown=_text(d, "shutdown", limit=200),
            root_cause=cause,
        )


@dataclass(frozen=True, slots=True)
class Tick:
    """``hb/tick/<k>``: node k's generation, push count, disk and one row per rank (each
    row checked by the record patcher that applies it)."""

    epoch: str | int
    gen: int
    seq: int | None
    rows: list[Any]
    disk: DiskState | None = None

    @property
    def key(self) -> tuple[str | int, int]:
        return self.epoch, self.gen

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Tick:
        d = load_json(raw)
        if type(d) is not dict:
            raise PayloadError(f"tick: expected an object, got {type(d).__name__}")
        epoch, gen = _generation(d)
        seq = d.get("seq")
        if seq is not None and type(seq) is not int:
            raise PayloadError("seq: expected an integer")
        rows = _list(d, "ranks", MAX_NODE_RANKS)
        return cls(epoch, gen, seq, rows, DiskState.from_dict(d.get("disk")))


@dataclass(frozen=True, slots=True)
class KillTarget:
    """A rank process to dump; ``kill``: SIGKILL it after the dumps."""

    rank: int
    pid: int
    kill: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KillTarget:
        """One entry of a kill request as it travels through the store."""
        return cls(rank=int(data["rank"]), pid=int(data["pid"]), kill=bool(data.get("kill")))


def parse_kill_request(raw: bytes | str | None) -> tuple[list[KillTarget], int]:
    """The targets of a kill request, each (rank, pid) once (a kill wins over a dump),
    at most :data:`MAX_KILL_TARGETS`; and how many entries were dropped."""
    items = load_json(raw)
    if type(items) is not list:
        raise PayloadError(f"kill request: expected a list, got {type(items).__name__}")
    chosen: dict[tuple[int, int], KillTarget] = {}
    dropped = 0
    for item in items:
        if type(item) is not dict:
            dropped += 1
            continue
        rank, pid, kill = item.get("rank"), item.get("pid"), item.get("kill", False)
        if type(rank) is not int or type(pid) is not int or type(kill) is not bool:
            dropped += 1
            continue
        key = (rank, pid)
        known = chosen.get(key)
        if known is None and len(chosen) >= MAX_KILL_TARGETS:
            dropped += 1
            continue
        if known is not None:
            dropped += 1  # a repeat (a kill replaces a dump of the same process)
        if known is None or (kill and not known.kill):
            chosen[key] = KillTarget(rank=rank, pid=pid, kill=kill)
    return list(chosen.values()), dropped
