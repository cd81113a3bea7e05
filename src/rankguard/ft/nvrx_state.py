"""NVRx's ``ft_state.json`` layout, read and written beside rankguard's own.

Megatron-LM keeps the state of NVRx's ``RankMonitorClient`` in ``<save>/ft_state.json``::

    {"current_timeouts": {
        "heartbeat": {"initial": 600.0, "subsequent": 180.0, "were_calculated": true},
        "section": {"section": {"setup": 600.0, "step": 180.0, "checkpointing": 420.0},
                    "out_of_section": 300.0,
                    "calculated_sections": ["step"],
                    "is_out_of_section_calculated": false}}}

(the client's ``state_dict()``; the script writes it and reads it back with
``load_state_dict()``). With ``fault_tolerance.state_dir`` pointing there, rankguard reads
the calculated values as learned timeouts (``setup``, ``step``, ``checkpointing`` and
any other calculated section; the out-of-section timeout; the heartbeat timeouts), and
at the end keeps that file in NVRx's layout, its calculated sections updated with what
rankguard learned, so the script's own client reads it as before, while rankguard's
state (runs, measured maxima) goes to ``rankguard_ft_state.json`` beside it.
"""

from __future__ import annotations

import copy
from typing import Any

from rankguard.schema.coerce import as_dict, as_finite, as_list
from rankguard.schema.jsontypes import JsonInput, JsonObject

__all__ = ["RANKGUARD_STATE_FILE", "from_nvrx", "is_nvrx_state", "to_nvrx"]

RANKGUARD_STATE_FILE = "rankguard_ft_state.json"  # beside an ft_state.json of NVRx's
_KEY = "current_timeouts"


def is_nvrx_state(state: Any) -> bool:
    return isinstance(state, dict) and isinstance(state.get(_KEY), dict)


def _number(value: Any) -> float | None:
    """A timeout NVRx calculated: a finite number of seconds above 0, else None."""
    seconds = as_finite(value)
    return seconds if seconds is not None and seconds > 0 else None


def from_nvrx(state: JsonInput) -> JsonObject:
    """rankguard's state (``timeouts`` by name) from NVRx's layout (``state`` one that
    :func:`is_nvrx_state` accepts): only what NVRx's client calculated (a configured
    value stays the launch's config). ValueError when the layout is broken."""
    current = as_dict(state.get(_KEY))
    if current is None:
        raise ValueError(f"{_KEY}: not a mapping")
    timeouts: JsonObject = {}
    section = current.get("section")
    if section is not None:
        if not isinstance(section, dict) or not isinstance(section.get("section", {}), dict):
            raise ValueError("current_timeouts.section: not a mapping of section timeouts")
        per_section = as_dict(section.get("section")) or {}
        calculated = section.get("calculated_sections") or []
        if not isinstance(calculated, list | tuple):
            raise ValueError("current_timeouts.section.calculated_sections: not a list")
        for name in calculated:
            if not isinstance(name, str):
                continue
            value = _number(per_section.get(name))
            if value is not None:
                timeouts[name] = value
        if section.get("is_out_of_section_calculated") is True:
            value = _number(section.get("out_of_section"))
            if value is not None:
                timeouts["out_of_section"] = value
    heartbeat = current.get("heartbeat")
    if isinstance(heartbeat, dict) and heartbeat.get("were_calculated") is True:
        value = _number(heartbeat.get("subsequent"))
        if value is not None:
            timeouts["heartbeat"] = value
        value = _number(heartbeat.get("initial"))
        if value is not None:
            timeouts["initial_heartbeat"] = value
    return {"schema_version": 1, "format": "nvrx", "timeouts": timeouts, "runs": 0}


def to_nvrx(previous: JsonObject, learned: dict[str, float]) -> JsonObject:
    """NVRx's layout again (``previous`` one that :func:`is_nvrx_state` accepts), with
    rankguard's learned ``setup``/``step``/``checkpointing`` (and any other section it
    learned) as calculated sections; the rest as it was."""
    out = copy.deepcopy(previous)
    current = as_dict(out.get(_KEY))
    if current is None:
        current = {}
        out[_KEY] = current
    section = as_dict(current.get("section"))
    if section is None:
        section = {}
        current["section"] = section
    timeouts = as_dict(section.get("section"))
    if timeouts is None:
        timeouts = {}
        section["section"] = timeouts
    calculated = list(as_list(section.get("calculated_sections")))
    for name, value in learned.items():
        if name in ("heartbeat", "initial_heartbeat", "out_of_section"):
            continue
        timeouts[name] = float(value)
        if name not in calculated:
            calculated.append(name)
    section["calculated_sections"] = calculated
    section.setdefault("out_of_section", None)
    section.setdefault("is_out_of_section_calculated", False)
    if "out_of_section" in learned:
        section["out_of_section"] = float(learned["out_of_section"])
        section["is_out_of_section_calculated"] = True
    return out
