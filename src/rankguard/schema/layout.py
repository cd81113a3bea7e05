"""Every name rankguard gives to a file, a folder or a store key: one place.

A run's files live under ``<log_dir>``::

    <log_dir>/
      heartbeat/<run_id>/                 RunLayout: the run directory (node-local)
        status.json                       atomically replaced each monitor scan
        status_ranks.json                 every rank's row, large jobs (periodically)
        findings.jsonl                    append-only, one finding a line
        restarts.jsonl                    append-only, one in-job restart a line
        perf_ranks.jsonl                  cross-rank step times (node 0)
        control.json                      the step every rank stops at (agreement)
        checkpoints.json                  rank 0's checkpoint state: last committed per
                                          tier, stage/write durations, write in flight
        launcher_node_<k>.json            what node k's launcher started
        gpu_health_node_<k>.json          node k's GPU health snapshot
        node_health_node_<k>.json         node k's NIC and storage checks (before a round)
        rank_<r>_pid_<p>.heartbeat.jsonl  one rank process's heartbeats (+ ``.1`` rotated)
        stacks/rank_<r>_pid_<p>.txt       stack dumps before a kill
      perf_monitor/<run_id>/              rank 0's perf.jsonl, perf_summary_<ts>.json and
                                          perf_job.json (the job the run belongs to)
      ft/rankguard_ft_state.json          learned timeouts (or fault_tolerance.state_dir,
                                          beside NVRx's ft_state.json there)
      ft/preempt_state.json               the last run's longest save (the grace budget)
      elastic/                            torch elastic's worker logs

Readers and writers (monitor, relay, status command, report, exporter, perf reporter,
fault tolerance, agreement) import these names; none spells a file name itself. No torch
import here: the light commands (``rankguard status``, ``report``) use this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CHECKPOINTS_FILE",
    "CONTROL_FILE",
    "EXCLUDED_NODES_FILE",
    "FINDINGS_FILE",
    "FT_STATE_FILE",
    "GOODPUT_FILE",
    "HEALTH_FILE_RE",
    "HEARTBEAT_FILE_RE",
    "HEARTBEAT_ROOT",
    "HEARTBEAT_SUFFIX",
    "LAUNCHER_FILE_RE",
    "PERF_JOB_FILE",
    "PERF_LOG_FILE",
    "PERF_RANKS_FILE",
    "PERF_ROOT",
    "PERF_SUMMARY_GLOB",
    "PERF_SUMMARY_PREFIX",
    "PREEMPT_STATE_FILE",
    "RERUN_FAULTY_PREFIX",
    "RERUN_VERDICT_FILE",
    "RESTARTS_FILE",
    "STATUS_FILE",
    "STATUS_RANKS_FILE",
    "RunLayout",
    "StoreKeys",
    "elastic_log_dir",
    "ft_state_dir",
    "health_file_name",
    "heartbeat_file_name",
    "launcher_file_name",
    "node_health_file_name",
    "note_request",
    "perf_dir",
    "rerun_state_file_name",
    "run_dir",
    "stack_file_name",
]

HEARTBEAT_ROOT = "heartbeat"  # <log_dir>/heartbeat/<run_id>: the run directories
PERF_ROOT = "perf_monitor"  # <log_dir>/perf_monitor/<run_id>: rank 0's perf files
STATUS_FILE = "status.json"
STATUS_RANKS_FILE = "status_ranks.json"  # every rank's row when status.json lists the worst
FINDINGS_FILE = "findings.jsonl"
RESTARTS_FILE = "restarts.jsonl"
GOODPUT_FILE = "goodput.json"  # node 0's latest goodput ledger (rankguard.goodput.status)
PERF_RANKS_FILE = "perf_ranks.jsonl"
CONTROL_FILE = "control.json"
CHECKPOINTS_FILE = "checkpoints.json"  # rank 0's CheckpointRecord.to_json()
PERF_LOG_FILE = "perf.jsonl"
PERF_JOB_FILE = "perf_job.json"  # which job a perf run belongs to (retention)
PERF_SUMMARY_PREFIX = "perf_summary_"
PERF_SUMMARY_GLOB = f"{PERF_SUMMARY_PREFIX}*.json"
FT_STATE_FILE = "ft_state.json"
PREEMPT_STATE_FILE = "preempt_state.json"  # next to ft_state.json: the last save time
STACKS_DIR = "stacks"
RERUN_VERDICT_FILE = "rerun_verdict.json"  # rank 0: the faulty hosts behind an exit 17
EXCLUDED_NODES_FILE = "excluded_nodes.json"  # bad-node exclusion: the hosts to leave out
RERUN_FAULTY_PREFIX = "rerun_faulty_rank_"  # rerun_faulty_rank_<r>.json: rank r's GPU (17)
HEARTBEAT_SUFFIX = ".heartbeat.jsonl"

HEARTBEAT_FILE_RE = re.compile(r"^rank_(\d+)_pid_(\d+)\.heartbeat\.jsonl$")
HEALTH_FILE_RE = re.compile(r"^gpu_health_node_(\d+)\.json$")
LAUNCHER_FILE_RE = re.compile(r"^launcher_node_(\d+)\.json$")


def heartbeat_file_name(rank: int, pid: int) -> str:
    return f"rank_{rank}_pid_{pid}{HEARTBEAT_SUFFIX}"


def health_file_name(node_rank: int) -> str:
    return f"gpu_health_node_{node_rank}.json"


def node_health_file_name(node_rank: int) -> str:
    """Node ``node_rank``'s NIC and storage checks (:mod:`rankguard.health.node_checks`)."""
    return f"node_health_node_{node_rank}.json"


def launcher_file_name(node_rank: int) -> str:
    return f"launcher_node_{node_rank}.json"


def preflight_file_name(node_rank: int | None, hostname: str) -> str:
    """The pre-launch GPU check of a node (before the rendezvous: by host name when the
    node's rank is not given on the command line)."""
    if node_rank is None:
        return f"preflight_{hostname}.json"
    return f"preflight_node_{node_rank}.json"


def rerun_state_file_name(rank: int) -> str:
    """A rank's saved re-run (batches, random state, results) in the rerun state_dir."""
    return f"rerun_state_rank_{rank}.pt"


def stack_file_name(rank: int, pid: int) -> str:
    return f"rank_{rank}_pid_{pid}.txt"


def run_dir(log_dir: str | Path, run_id: str) -> Path:
    """The node-local run directory ``<log_dir>/heartbeat/<run_id>`` (absolute)."""
    return Path(log_dir).resolve() / HEARTBEAT_ROOT / run_id


def perf_dir(log_dir: str | Path, run_id: str) -> Path:
    """Rank 0's performance files: ``<log_dir>/perf_monitor/<run_id>``."""
    return Path(log_dir) / PERF_ROOT / run_id


def ft_state_dir(log_dir: str | Path, state_dir: str | None) -> Path:
    """Where ``ft_state.json`` lives: ``fault_tolerance.state_dir``, else ``<log_dir>/ft``."""
    return Path(state_dir) if state_dir else Path(log_dir).resolve() / "ft"


def elastic_log_dir(log_dir: str | Path) -> Path:
    return Path(log_dir).resolve() / "elastic"


@dataclass(frozen=True, slots=True)
class RunLayout:
    """The paths of one run directory."""

    root: Path

    @classmethod
    def of(cls, log_dir: str | Path, run_id: str) -> RunLayout:
        return cls(run_dir(log_dir, run_id))

    @property
    def status(self) -> Path:
        return self.root / STATUS_FILE

    @property
    def status_ranks(self) -> Path:
        return self.root / STATUS_RANKS_FILE

    @property
    def findings(self) -> Path:
        return self.root / FINDINGS_FILE

    @property
    def restarts(self) -> Path:
        return self.root / RESTARTS_FILE

    @property
    def goodput(self) -> Path:
        return self.root / GOODPUT_FILE

    @property
    def perf_ranks(self) -> Path:
        return self.root / PERF_RANKS_FILE

    @property
    def control(self) -> Path:
        return self.root / CONTROL_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_FILE

    @property
    def stacks_dir(self) -> Path:
        return self.root / STACKS_DIR

    def heartbeat(self, rank: int, pid: int) -> Path:
        return self.root / heartbeat_file_name(rank, pid)

    def health(self, node_rank: int) -> Path:
        return self.root / health_file_name(node_rank)

    def launcher(self, node_rank: int) -> Path:
        return self.root / launcher_file_name(node_rank)

    @property
    def rerun_verdict(self) -> Path:
        return self.root / RERUN_VERDICT_FILE

    def stack_dump(self, rank: int, pid: int) -> Path:
        return self.stacks_dir / stack_file_name(rank, pid)


class StoreKeys:
    """Keys of one run in the rendezvous store (the multi-node channel)."""

    def __init__(self, run_id: str) -> None:
        self.prefix = f"rankguard/{run_id}/"

    def heartbeats(self, node_rank: int) -> str:
        """Node k's relay: latest record per local rank plus its GPU health, rewritten
        when more than the fields of its ``tick`` changed."""
        return f"{self.prefix}hb/node/{node_rank}"

    def tick(self, node_rank: int) -> str:
        """Node k's relay, every push: the fields of each local rank that move with
        time, over the records of ``heartbeats`` (:mod:`rankguard.relay.delta`)."""
        return f"{self.prefix}hb/tick/{node_rank}"

    def done(self, node_rank: int) -> str:
        """Node k's relay has pushed its last records."""
        return f"{self.prefix}done/node/{node_rank}"

    def kill(self, node_rank: int) -> str:
        """Node 0 asks node k to dump stacks and kill a culprit."""
        return f"{self.prefix}kill/node/{node_rank}"

    def traces_request(self, node_rank: int) -> str:
        """Node 0 asks node k for its ranks' flight-recorder traces (a hang)."""
        return f"{self.prefix}fr/request/{node_rank}"

    @property
    def requests(self) -> str:
        """A counter node 0 bumps (``add``) after it writes any request for the relays
        (the stop step, a trace request, a kill request): each relay reads it at every
        push (one ``add`` of 0) and looks for the requests themselves only when it
        moved (:func:`note_request`)."""
        return f"{self.prefix}requests"

    @property
    def early_pushes(self) -> str:
        """A counter each relay bumps (``add``) after a push off its schedule (its
        first, one its launcher or agent asked for at once, its last): node 0 reads
        it at every scan (one ``add`` of 0) and reads every node's tick when it moved,
        not only those of the nodes whose next push was due."""
        return f"{self.prefix}early_pushes"

    def traces(self, node_rank: int) -> str:
        """Node k's answer: the traces of its ranks that answered, compacted."""
        return f"{self.prefix}fr/node/{node_rank}"

    @property
    def monitor_started(self) -> str:
        """Node 0's monitor started (in some round): an agent hosting the store that
        never had a number waits for that monitor only if one ran."""
        return f"{self.prefix}monitor_started"

    @property
    def monitor_done(self) -> str:
        """Node 0's monitor wrote its final status: the agent hosting the store (when
        it is another node) may let the store go."""
        return f"{self.prefix}monitor_done"

    @property
    def control(self) -> str:
        """The stop step every node's relay writes into ``control.json``."""
        return f"{self.prefix}control"

    @property
    def preempt(self) -> str:
        """Node 0: the job is preempted (stop step, reason); every node's launcher watches."""
        return f"{self.prefix}preempt"

    @property
    def run_dir_name(self) -> str:
        """The run directory every node uses when the run id is torchrun's default
        (``compare_set``: the first node's proposal wins)."""
        return f"{self.prefix}run_dir_name"

    def excluded(self, node: str) -> str:
        """Bad-node exclusion: ``node`` (host and launcher pid) left the job; its
        finding, read by the nodes left (the hosts for the scheduler)."""
        return f"{self.prefix}excluded/{node}"

    @property
    def excluded_count(self) -> str:
        """How many nodes exclusion took out (a counter: ``add``)."""
        return f"{self.prefix}excluded_count"

    @property
    def excluded_ended(self) -> str:
        """How many nodes ended because too few were left after exclusions (a counter):
        an excluded node hosting the store keeps it until they read the host list."""
        return f"{self.prefix}excluded_ended"

    def first_failure(self, round_key: str) -> str:
        """The node whose ranks failed first in the round ``round_key`` (``compare_set``:
        the first to ask wins): the node that caused the restart."""
        return f"{self.prefix}first_failure/{round_key}"

    def preempt_request(self, node_rank: int) -> str:
        """Node k's launcher received the exit signal: node 0 starts the preemption."""
        return f"{self.prefix}preempt/request/node/{node_rank}"


def note_request(store: Any, keys: StoreKeys) -> None:
    """Node 0 wrote a request for the relays into the store: bump the request counter
    (:attr:`StoreKeys.requests`) so that the relays, which read only that counter at
    each push, look for it. A store without ``add`` has relays that look for every
    request at every push."""
    add = getattr(store, "add", None)
    if add is not None:
        add(keys.requests, 1)
