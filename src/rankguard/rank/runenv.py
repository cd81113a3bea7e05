"""The run's environment, read in one place: what the launcher told this process.

``rankguard run`` passes a rank everything it needs through environment variables: its
own (the names in :class:`ENV`) and torch elastic's (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_*``, ``MASTER_ADDR``/``MASTER_PORT``).
:class:`RunEnv` is that contract as one typed object: parsed and validated here (a bad
value raises ``ValueError`` naming the variable), the run's config decoded once, and
handed to the components that need it (the session, the checkpoint manager, the
in-process restart, the preemption handler), so none of them reads ``os.environ`` for
these names itself.

:func:`current` is this process's :class:`RunEnv`. The environment of a process can
change after import (a ``--preload`` fork server's child is given its rank's variables
after the fork; tests set them), so ``current()`` compares the variables it depends on
with the ones it last parsed and parses again only when they differ: the config's JSON
is decoded once per value, not once per caller.

Nothing here imports torch, and of rankguard only the schedulers' variable names
(:mod:`rankguard.scheduler`): this module is near the bottom of the import graph (a config
section is decoded by :mod:`rankguard.util.configdoc`, below it; the whole config by
:func:`rankguard.config.run_config`, above it).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rankguard.scheduler import JOB_ID_VARIABLES

T = TypeVar("T")

__all__ = ["ELASTIC", "ENV", "NAMES", "RunEnv", "current"]


class ENV:
    """Environment variables set by the launcher for every rank."""

    RUN_ID = "RANKGUARD_RUN_ID"
    RUN_DIR = "RANKGUARD_RUN_DIR"  # node-local heartbeat directory of the run
    NODE_RANK = "RANKGUARD_NODE_RANK"
    CONFIG = "RANKGUARD_CONFIG"  # JSON of the validated RankguardConfig
    LAUNCHER = "RANKGUARD_LAUNCHER"  # "1" under rankguard run
    LOG_DIR = "RANKGUARD_LOG_DIR"  # absolute log_dir of this node
    JOB = "RANKGUARD_JOB"  # the training job: its script (absolute) or module
    LAUNCHER_PID = "RANKGUARD_LAUNCHER_PID"  # the ranks die with it (heartbeat.lifeline)
    # set by the sbatch script: where an exit 17 leaves the hosts to exclude (rerun)
    EXCLUDE_FILE = "RANKGUARD_EXCLUDE_FILE"
    # the most ranks the rendezvous admits (--nnodes MIN:MAX: MAX * nproc-per-node)
    MAX_WORLD_SIZE = "RANKGUARD_MAX_WORLD_SIZE"


class ELASTIC:
    """Variables torch elastic's agent sets for every worker (torchrun's contract),
    and the scheduler's job id."""

    RANK = "RANK"
    LOCAL_RANK = "LOCAL_RANK"
    WORLD_SIZE = "WORLD_SIZE"
    LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
    GROUP_RANK = "GROUP_RANK"
    RUN_ID = "TORCHELASTIC_RUN_ID"
    RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
    MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
    MASTER_ADDR = "MASTER_ADDR"
    MASTER_PORT = "MASTER_PORT"
    CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


_ENV_NAMES = tuple(v for k, v in vars(ENV).items() if k.isupper())
_ELASTIC_NAMES = tuple(v for k, v in vars(ELASTIC).items() if k.isupper())
#: Every variable :class:`RunEnv` reads (the launcher's, torch elastic's, the scheduler's).
NAMES = _ENV_NAMES + _ELASTIC_NAMES + JOB_ID_VARIABLES


def _int(env: Mapping[str, str], name: str, default: int | None, *, lo: int) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r:.60}") from None
    if value < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {value}")
    return value


def _text(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnv:
    """What the launcher (``rankguard run``, or plain torchrun) told this process.

    ``launcher``: started by ``rankguard run`` (``RANKGUARD_LAUNCHER=1``). ``torchrun``:
    started by torch elastic's agent without rankguard's launcher. Ranks, sizes and the
    restart count default as torch elastic's own defaults would (0, 0, 1, 0)."""

    launcher: bool = False
    run_id: str | None = None
    run_dir: str | None = None
    node_rank: int | None = None
    config_text: str | None = None
    log_dir: str | None = None
    job: str | None = None
    launcher_pid: int | None = None
    exclude_file: str | None = None
    max_world_size: int | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int | None = None
    group_rank: int | None = None
    elastic_run_id: str | None = None
    restart_count: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    #: the job's id as its scheduler names it (:data:`rankguard.scheduler.JOB_ID_VARIABLES`)
    scheduler_job_id: str | None = None
    cuda_visible_devices: str | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RunEnv:
        """Parse ``environ`` (default: this process's); ValueError names the variable."""
        env = os.environ if environ is None else environ
        pid_text = env.get(ENV.LAUNCHER_PID, "").strip()
        # a launcher pid that is not one (empty, garbage, 0, 1) means "no lifeline":
        # never a reason to refuse to train
        launcher_pid = int(pid_text) if pid_text.isdigit() and int(pid_text) > 1 else None
        return cls(
            launcher=env.get(ENV.LAUNCHER) == "1",
            run_id=_text(env, ENV.RUN_ID),
            run_dir=_text(env, ENV.RUN_DIR),
            node_rank=_int(env, ENV.NODE_RANK, None, lo=0),
            config_text=_text(env, ENV.CONFIG),
            log_dir=_text(env, ENV.LOG_DIR),
            job=_text(env, ENV.JOB),
            launcher_pid=launcher_pid,
            exclude_file=_text(env, ENV.EXCLUDE_FILE),
            max_world_size=_int(env, ENV.MAX_WORLD_SIZE, None, lo=1),
            rank=_int(env, ELASTIC.RANK, 0, lo=0) or 0,
            local_rank=_int(env, ELASTIC.LOCAL_RANK, 0, lo=0) or 0,
            world_size=_int(env, ELASTIC.WORLD_SIZE, 1, lo=1) or 1,
            local_world_size=_int(env, ELASTIC.LOCAL_WORLD_SIZE, None, lo=0) or None,
            group_rank=_int(env, ELASTIC.GROUP_RANK, None, lo=0),
            elastic_run_id=_text(env, ELASTIC.RUN_ID),
            restart_count=_int(env, ELASTIC.RESTART_COUNT, 0, lo=0) or 0,
            master_addr=_text(env, ELASTIC.MASTER_ADDR),
            master_port=_int(env, ELASTIC.MASTER_PORT, None, lo=1),
            scheduler_job_id=next(
                (v for v in (_text(env, name) for name in JOB_ID_VARIABLES) if v), None
            ),
            cuda_visible_devices=env.get(ELASTIC.CUDA_VISIBLE_DEVICES),
        )

    # ---- who started this process ---------------------------------------------------

    @property
    def monitored(self) -> bool:
        """A rank of ``rankguard run`` with a run directory: heartbeats go there."""
        return self.launcher and self.run_dir is not None

    @property
    def torchrun(self) -> bool:
        """Started by torch elastic's agent (torchrun) without rankguard's launcher."""
        return not self.monitored and self.elastic_run_id is not None

    @property
    def node(self) -> int:
        """This node's rank: the launcher's, else torch elastic's group rank, else 0."""
        if self.node_rank is not None:
            return self.node_rank
        return self.group_rank if self.group_rank is not None else 0

    @property
    def job_id(self) -> str | None:
        """The job's id as the launcher, torch elastic or the scheduler named it."""
        for value in (self.run_id, self.elastic_run_id, self.scheduler_job_id):
            if value and value != "none":
                return value
        return None

    # ---- the run's config -----------------------------------------------------------

    def section(self, name: str, cls: type[T]) -> T | None:
        """Section ``name`` of the config ``rankguard run`` gave this rank, decoded as the
        component's own config class ``cls`` (strictly, as the root config decodes it;
        once per section), or None outside the launcher. A component reads its section
        here without importing the root config (:func:`rankguard.config.run_config`),
        which imports every component's."""
        if not self.launcher or not self.config_text:
            return None
        from rankguard.util.configdoc import build

        return self.memo(
            f"section:{name}", lambda: build(cls, self.raw_section(name), prefix=f"{name}.")
        )

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """``make()``, computed once for this environment under ``key`` (what is decoded
        from it: the config, a section)."""
        if key not in self._cache:
            self._cache[key] = make()
        value: T = self._cache[key]
        return value

    def batch_plan(self, global_batch: int, micro_batch: int) -> Any:
        """This rank's share of a step at the current world size, by the run's
        ``elastic.batch_rule`` (:mod:`rankguard.rank.elastic`; ``keep_global`` outside the
        launcher)."""
        from rankguard.rank.elastic import batch_plan

        rule = str(self.raw_section("elastic").get("batch_rule") or "keep_global")
        full = max(self.max_world_size or self.world_size, self.world_size)
        return batch_plan(
            global_batch, micro_batch, self.world_size, rule=rule, full_world_size=full
        )

    def raw_section(self, name: str) -> dict[str, Any]:
        """One section of the config's JSON as it came, without building the config
        (for processes that must stay light: a DataLoader worker's signal setup). Empty
        when there is no config or the section is not an object."""
        if "raw" not in self._cache:
            try:
                raw = json.loads(self.config_text) if self.config_text else {}
            except ValueError:
                raw = {}
            self._cache["raw"] = raw if isinstance(raw, dict) else {}
        section = self._cache["raw"].get(name)
        return section if isinstance(section, dict) else {}


_lock = threading.Lock()
_current: tuple[tuple[str | None, ...], RunEnv] | None = None


def current() -> RunEnv:
    """This process's :class:`RunEnv` (parsed again only when the variables changed)."""
    global _current
    key = tuple(os.environ.get(name) for name in NAMES)
    cached = _current
    if cached is not None and cached[0] == key:
        return cached[1]
    env = RunEnv.from_environ({n: v for n, v in zip(NAMES, key, strict=True) if v is not None})
    with _lock:
        _current = (key, env)
    return env
