"""Every delay and timeout the monitoring side derives from the configuration, in one place.

Two intervals set the pace of a job: ``p``, the heartbeat publish interval (a rank writes
a record at least that often; a relay pushes a node's records as often), and ``s``, the
monitor's scan interval. Every wait the monitor, its rules, the stop agreement, the
preemption coordinator and the launcher's drain allow is a formula in ``p`` and ``s``;
each one is a named property of :class:`Cadence`, documented here and nowhere else:

========================  =====================  ===============================================
property                  formula                what waits that long
========================  =====================  ===============================================
``fresh_s``               2p + s                 a rank's latest record still counts as fresh
``stop_lead_s``           2p + 2s + 1            every rank hears of an agreed stop step
``fresh_lead_s``          2s + 1                 the same, from progress read fresh
``fresh_wait_s``          p + s + 1              relayed ranks' records become fresh again
``agreement_lead_s(r)``   r: (p+s+1)+(2p+2s+1)   exit signal to stop step (r: relayed nodes)
                          else: s + (2s + 1)
``drain_s(r)``            max(2p + s, 5)         node 0's last drain of the ranks' records
                          (+2p when r)           (r: other nodes' relays push them)
``learned_floor_s``       2p                     the least a learned heartbeat timeout may be
========================  =====================  ===============================================

The timeouts of the phases come from the validated configuration (the heartbeat section,
NVRx's names for its heartbeat and section timeouts, the in-process restart's hard
timeout) and, with ``calc_ft_timeouts``, from the previous runs: :attr:`Cadence.sources`
says where each came from, and :meth:`Cadence.in_force` is what ``status.json``'s
``timeouts`` block (``rankguard status``: "Timeouts in force") shows, phase by phase.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rankguard.schema.jsontypes import JsonObject

if TYPE_CHECKING:
    from rankguard.monitor.config import HeartbeatConfig

__all__ = ["DRAIN_FLOOR_S", "Cadence"]

#: node 0's final drain waits at least this long: it ends as soon as every rank has
#: ended, and a loaded machine can take longer than a few intervals to scan the ranks'
#: last records
DRAIN_FLOOR_S = 5.0

# The phases whose timeout a section of the same name replaces, and the heartbeat key
# each one has without a section.
_PROGRESS_KEYS = {
    "setup": "initial_progress_timeout_s",
    "step": "progress_timeout_s",
    "checkpointing": "checkpoint_timeout_s",
}


@dataclass(frozen=True, slots=True)
class Cadence:
    """The intervals and the timeouts in force of one job, computed once by the launcher
    (:meth:`of`) and handed to the monitor, its rules, the relay, the stop agreement and
    the preemption coordinator."""

    publish_interval_s: float  # p
    scan_interval_s: float  # s
    initial_process_timeout_s: float
    process_timeout_s: float
    initial_progress_timeout_s: float
    progress_timeout_s: float
    checkpoint_timeout_s: float
    eval_timeout_s: float
    #: a phase's own timeout (NVRx's ``rank_section_timeouts``, the in-process restart's
    #: phase): ``setup``, ``step`` and ``checkpointing`` replace the progress timeout of
    #: those phases; any other name is the timeout of that phase
    sections: Mapping[str, float] = field(default_factory=dict)
    #: NVRx's ``rank_out_of_section_timeout``: that of a phase without one
    out_of_section_s: float | None = None
    #: where each timeout came from, by the config key it is read from (``section.step``,
    #: ``heartbeat.process_timeout_s``, ``out_of_section``); missing: ``config``
    sources: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        hb: HeartbeatConfig,
        *,
        sections: Mapping[str, float] | None = None,
        out_of_section_s: float | None = None,
        sources: Mapping[str, str] | None = None,
    ) -> Cadence:
        """The cadence of a validated heartbeat section and the section timeouts."""
        return cls(
            publish_interval_s=hb.publish_interval_s,
            scan_interval_s=hb.scan_interval_s,
            initial_process_timeout_s=hb.initial_process_timeout_s,
            process_timeout_s=hb.process_timeout_s,
            initial_progress_timeout_s=hb.initial_progress_timeout_s,
            progress_timeout_s=hb.progress_timeout_s,
            checkpoint_timeout_s=hb.checkpoint_timeout_s,
            eval_timeout_s=hb.eval_timeout_s,
            sections=dict(sections or {}),
            out_of_section_s=out_of_section_s,
            sources=dict(sources or {}),
        )

    # ---- delays derived from the intervals ---------------------------------------------

    @property
    def fresh_s(self) -> float:
        """2p + s: a rank's heartbeats are fresh while its latest record is at most this
        old; only then can it be "alive and not progressing"."""
        return 2.0 * self.publish_interval_s + self.scan_interval_s

    @property
    def stop_lead_s(self) -> float:
        """2p + 2s + 1: how long every rank may take to hear of an agreed stop step from
        the progress the monitor knows (a record up to two intervals old, two scans)."""
        return 2 * self.publish_interval_s + 2 * self.scan_interval_s + 1.0

    @property
    def fresh_lead_s(self) -> float:
        """2s + 1: the stop step's lead when every rank's progress was just read fresh."""
        return 2 * self.scan_interval_s + 1.0

    @property
    def fresh_wait_s(self) -> float:
        """p + s + 1: the longest wait for fresh progress after the exit signal when other
        nodes' records come through the relays (pushed once per interval)."""
        return self.publish_interval_s + self.scan_interval_s + 1.0

    def agreement_lead_s(self, relayed: bool) -> float:
        """Seconds from the exit signal to the stop step, at most: waiting for fresh
        progress (relayed: :attr:`fresh_wait_s`; else about one scan), then the stop
        step's lead (relayed: :attr:`stop_lead_s`; else :attr:`fresh_lead_s`)."""
        if relayed:
            return self.fresh_wait_s + self.stop_lead_s
        return self.scan_interval_s + self.fresh_lead_s

    def drain_s(self, relayed: bool) -> float:
        """max(2p + s (+ 2p relayed), 5): node 0's last wait for the ranks' final records
        (and the other nodes' relays) when the job ends."""
        drain = 2 * self.publish_interval_s + self.scan_interval_s
        if relayed:
            drain += 2 * self.publish_interval_s
        return max(drain, DRAIN_FLOOR_S)

    @property
    def learned_floor_s(self) -> float:
        """2p: a learned heartbeat timeout is never shorter (one late record is no hang)."""
        return self.publish_interval_s * 2

    # ---- the timeouts of the phases ------------------------------------------------------

    @property
    def setup_timeout_s(self) -> float:
        """Before the first completed step: the ``setup`` section, else
        ``initial_progress_timeout_s``."""
        return self.sections.get("setup", self.initial_progress_timeout_s)

    @property
    def step_timeout_s(self) -> float:
        """Training steps: the ``step`` section, else ``progress_timeout_s``."""
        return self.sections.get("step", self.progress_timeout_s)

    @property
    def checkpointing_timeout_s(self) -> float:
        """While saving: the ``checkpointing`` section, else ``checkpoint_timeout_s``."""
        return self.sections.get("checkpointing", self.checkpoint_timeout_s)

    @property
    def shortest_progress_timeout_s(self) -> float:
        """The shortest progress or section timeout: a rank is due by then at the latest."""
        return min(
            self.progress_timeout_s,
            self.initial_progress_timeout_s,
            self.checkpoint_timeout_s,
            *self.sections.values(),
            *((self.out_of_section_s,) if self.out_of_section_s is not None else ()),
        )

    def _source(self, key: str, config_key: str) -> str:
        return self.sources.get(key) or f"config ({config_key})"

    def in_force(self) -> dict[str, JsonObject]:
        """Each phase's timeout and where it came from (``status.json``'s ``timeouts``):
        ``phase.setup``, ``phase.step`` and ``phase.checkpointing`` name the section that
        replaced the heartbeat timeout, if one did; ``phase.eval``, every other section,
        ``phase.closing`` (the session's close after the script returned: the checkpoint
        timeout, unless a section or the out-of-section timeout is its own),
        ``phase.other`` (a phase without its own timeout) and the process timeouts."""
        out: dict[str, JsonObject] = {}

        def put(name: str, value: float, source: str) -> None:
            out[name] = {"value": value, "source": source}

        for name, key in (
            ("initial_process", "initial_process_timeout_s"),
            ("process", "process_timeout_s"),
        ):
            put(name, getattr(self, key), self._source(f"heartbeat.{key}", f"heartbeat.{key}"))
        for phase, key in (*_PROGRESS_KEYS.items(), ("eval", "eval_timeout_s")):
            section = f"section.{phase}"
            if phase in self.sections:
                where = self._source(section, f"fault_tolerance.rank_section_timeouts.{phase}")
                put(f"phase.{phase}", self.sections[phase], where)
            elif phase == "eval" and self.out_of_section_s is not None:
                where = self._source(
                    "out_of_section", "fault_tolerance.rank_out_of_section_timeout"
                )
                put("phase.eval", self.out_of_section_s, where)
            else:
                put(
                    f"phase.{phase}",
                    getattr(self, key),
                    self._source(f"heartbeat.{key}", f"heartbeat.{key}"),
                )
        for phase, value in self.sections.items():
            if phase not in _PROGRESS_KEYS and phase != "eval":
                where = self._source(
                    f"section.{phase}", f"fault_tolerance.rank_section_timeouts.{phase}"
                )
                put(f"phase.{phase}", value, where)
        if "closing" not in self.sections:  # the session's close: a save's timeout
            if self.out_of_section_s is not None:
                where = self._source(
                    "out_of_section", "fault_tolerance.rank_out_of_section_timeout"
                )
                put("phase.closing", self.out_of_section_s, where)
            else:
                key = "heartbeat.checkpoint_timeout_s"
                put("phase.closing", self.checkpoint_timeout_s, self._source(key, key))
        if self.out_of_section_s is not None:
            where = self._source("out_of_section", "fault_tolerance.rank_out_of_section_timeout")
            put("phase.other", self.out_of_section_s, where)
        else:
            key = "heartbeat.progress_timeout_s"
            put("phase.other", self.progress_timeout_s, self._source(key, key))
        return out
