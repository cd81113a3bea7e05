"""Learned timeouts (``calc_ft_timeouts``): measured, saved, reused by the next run.

Each rank measures its sections (:mod:`.stats`) and carries them in its heartbeats;
at the end of a run the launcher on node 0 takes the maximum over ranks of

- ``setup``: start-up to the first completed step,
- ``step``: the longest step after warm-up, trusted only after ``MIN_STEPS`` steps,
- ``checkpointing``: the longest save, only if a real save happened,
- ``heartbeat``: the longest gap between two heartbeat records,

multiplies it by ``safety_factor`` (NVRx: 5), floors it at ``min_learned_timeout_s`` (a
tight loop must not teach a 4 ms timeout that kills the next slow start), merges it
with the previous value (mean of old and new: an EMA with weight 0.5) and saves it
atomically in ``rankguard_ft_state.json`` in ``fault_tolerance.state_dir`` (default
``<log_dir>/ft``, next to the checkpoints is better): ``ft_state.json`` is NVRx's name,
read and kept in NVRx's layout when there is one, never rankguard's own state. The next run with
``calc_ft_timeouts`` starts with those timeouts: ``setup``, ``step`` and
``checkpointing`` become section timeouts and ``heartbeat`` the process timeout;
``status.json`` says where each timeout came from.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.nvrx_state import RANKGUARD_STATE_FILE, from_nvrx, is_nvrx_state, to_nvrx
from rankguard.schema.blocks import FtStatsBlock, read_block
from rankguard.schema.cadence import Cadence
from rankguard.schema.coerce import as_dict, as_float, as_int
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import FT_STATE_FILE
from rankguard.schema.records import HeartbeatRecord
from rankguard.util.fs import atomic_write_json

if TYPE_CHECKING:
    from rankguard.config import RankguardConfig

__all__ = [
    "MIN_STEPS",
    "STATE_FILE",
    "learn",
    "learned_config",
    "load_state",
    "measured_maxima",
    "save_learned",
]

logger = logging.getLogger(__name__)

STATE_FILE = FT_STATE_FILE  # the name rankguard.schema.layout gives it
_SECTIONS = ("setup", "step", "checkpointing")
_NOT_SECTIONS = ("heartbeat", "initial_heartbeat", "out_of_section")
MIN_STEPS = 16
EMA_WEIGHT = 0.5


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid ft_state.json ({exc})") from exc


def load_state(path: Path) -> JsonObject | None:
    """rankguard's learned state from ``path``: rankguard's own layout, or NVRx's
    (``current_timeouts``, as Megatron-LM keeps it in ``<save>/ft_state.json``), then
    rankguard's ``rankguard_ft_state.json`` beside it when there is one."""
    state = _read(path)
    own = _read(path.parent / RANKGUARD_STATE_FILE)  # rankguard's own, never NVRx's name
    if isinstance(own, dict) and isinstance(own.get("timeouts"), dict):
        return own
    if state is None:
        return None
    if is_nvrx_state(state):
        try:
            return from_nvrx(state)
        except ValueError as exc:
            raise ValueError(f"{path}: not a valid ft_state.json of NVRx ({exc})") from exc
    if not isinstance(state, dict) or not isinstance(state.get("timeouts"), dict):
        raise ValueError(
            f"{path}: not a valid ft_state.json (neither rankguard's 'timeouts' mapping "
            "nor NVRx's 'current_timeouts')"
        )
    return state


def measured_maxima(records: list[HeartbeatRecord]) -> dict[str, float]:
    """Max over ranks of each trustworthy section measurement (``ft_stats``)."""
    out: dict[str, float] = {}

    def keep(name: str, value: Any) -> None:
        if isinstance(value, (int, float)) and value > 0:
            out[name] = max(out.get(name, 0.0), float(value))

    def count(value: Any) -> int:
        return int(value) if isinstance(value, (int, float)) and value == value else 0

    for rec in records:
        stats = read_block(rec, FtStatsBlock)
        if stats is None:
            continue
        keep("setup", stats.setup_s)
        if count(stats.steps) >= MIN_STEPS:
            keep("step", stats.step_max_s)
        if count(stats.ckpts) >= 1:
            keep("checkpointing", stats.ckpt_max_s)
        keep("heartbeat", stats.hb_gap_max_s)
    return out


def learn(
    measured: dict[str, float],
    previous: JsonObject | None,
    *,
    safety_factor: float,
    floor_s: float,
) -> JsonObject:
    """New ``ft_state.json`` content from this run's maxima and the previous state."""
    old = learned_timeouts(previous)
    timeouts: JsonObject = dict(old)
    samples: JsonObject = {}
    for name, value in measured.items():
        candidate = max(floor_s, value * safety_factor)
        if name in old:
            candidate = EMA_WEIGHT * old[name] + (1 - EMA_WEIGHT) * candidate
        timeouts[name] = round(max(floor_s, candidate), 3)
        samples[name] = round(value, 6)
    return {
        "schema_version": 1,
        "updated_wall_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": (as_int((previous or {}).get("runs")) or 0) + 1,
        "safety_factor": safety_factor,
        "min_learned_timeout_s": floor_s,
        "timeouts": timeouts,
        "last_measured_max_s": samples,
    }


def learned_timeouts(state: JsonObject | None) -> dict[str, float]:
    """The learned timeouts of an ``ft_state.json`` by name (a value that is not a
    number reads as missing)."""
    raw = as_dict((state or {}).get("timeouts")) or {}
    return {name: value for name, v in raw.items() if (value := as_float(v)) is not None}


def save_state(path: Path, state: JsonObject) -> None:
    atomic_write_json(path, state)


def save_learned(
    state_dir: Path, ft: FaultToleranceConfig, records: list[HeartbeatRecord]
) -> JsonObject | None:
    """End of a run with ``calc_ft_timeouts``: merge this run's measurements into
    ``ft_state.json``; None (and a warning) when nothing was measured."""
    measured = measured_maxima(records)
    if not measured:
        logger.warning("rankguard: calc_ft_timeouts: nothing measured, ft_state unchanged")
        return None
    path = Path(state_dir) / STATE_FILE
    try:
        previous = load_state(path)
    except ValueError as exc:
        logger.warning("rankguard: %s; starting a new one", exc)
        previous = None
    state = learn(
        measured, previous, safety_factor=ft.safety_factor, floor_s=ft.min_learned_timeout_s
    )
    try:
        nvrx = _read(path)
    except ValueError:
        nvrx = None
    # rankguard's own state under its own name; NVRx's file, when there is one, stays
    # NVRx's (its calculated sections updated)
    save_state(path.parent / RANKGUARD_STATE_FILE, state)
    where = str(path.parent / RANKGUARD_STATE_FILE)
    if is_nvrx_state(nvrx):
        save_state(path, to_nvrx(nvrx, learned_timeouts(state)))
        where += f" and {path} (NVRx's layout)"
    logger.warning(
        "rankguard: learned timeouts saved in %s: %s", where, json.dumps(state["timeouts"])
    )
    return state


def learned_config(
    cfg: RankguardConfig, state: JsonObject | None, source: str
) -> tuple[RankguardConfig, dict[str, str]]:
    """A new configuration (``cfg``, a RankguardConfig, is left as it is) with the learned
    timeouts of ``state`` in it, and ``source`` for each timeout they set, by the key the
    timeout is read from (``section.step``, ``heartbeat.process_timeout_s``,
    ``out_of_section``): :class:`rankguard.schema.cadence.Cadence` shows them under "Timeouts in
    force". A learned heartbeat timeout is never below :attr:`Cadence.learned_floor_s`;
    NVRx's names for the heartbeat timeouts, when set, take the learned values too (they
    are the same timeouts)."""
    ft, hb = cfg.fault_tolerance, cfg.heartbeat
    learned = learned_timeouts(state)
    sources: dict[str, str] = {}
    sections = dict(ft.rank_section_timeouts)
    for name in (*_SECTIONS, *(n for n in learned if n not in _NOT_SECTIONS + _SECTIONS)):
        if name in learned:
            sections[name] = learned[name]
            sources[f"section.{name}"] = source
    floor = Cadence.of(hb).learned_floor_s
    hb_changes: dict[str, Any] = {}  # the keyword arguments of replace()
    ft_changes: dict[str, Any] = {"rank_section_timeouts": sections}
    for key, hb_name, nvrx_name in (
        ("heartbeat", "process_timeout_s", "rank_heartbeat_timeout"),
        ("initial_heartbeat", "initial_process_timeout_s", "initial_rank_heartbeat_timeout"),
    ):
        if key in learned:
            hb_changes[hb_name] = max(learned[key], floor)
            sources[f"heartbeat.{hb_name}"] = source
            if getattr(ft, nvrx_name) is not None:
                ft_changes[nvrx_name] = hb_changes[hb_name]
    if "out_of_section" in learned:  # NVRx's calculated out-of-section timeout
        ft_changes["rank_out_of_section_timeout"] = learned["out_of_section"]
        sources["out_of_section"] = source
    new = replace(
        cfg,
        heartbeat=replace(hb, **hb_changes),
        fault_tolerance=replace(ft, **ft_changes),
    )
    return new, sources
