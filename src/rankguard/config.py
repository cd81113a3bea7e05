"""Typed, strict configuration.

Each component owns a ``@dataclass(kw_only=True, slots=True)`` config validated in
``__post_init__``; :class:`RankguardConfig` only composes them. A run is configured from
an optional YAML file plus ``a.b.c=value`` overrides. Unknown keys and values of the
wrong type are errors that name the full dotted key and what is allowed; nothing is
silently ignored.

The FlagScale layout (``experiment: runner: heartbeat: ...``) is accepted as written:
a document whose only top-level key is ``experiment`` is unwrapped to its ``runner``
block, and overrides may carry the ``experiment.runner.`` prefix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rankguard.checkpoint.config import CheckpointConfig
from rankguard.ft.config import FaultToleranceConfig
from rankguard.health.node_config import NodeHealthConfig
from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.layouts import check_envs, normalize, unwrap_flagscale
from rankguard.monitor.config import HeartbeatConfig
from rankguard.perf.config import PerfConfig
from rankguard.preempt.config import PreemptionConfig
from rankguard.rank import runenv
from rankguard.rank.elastic import ElasticConfig
from rankguard.rerun.config import RerunStateMachineConfig
from rankguard.scheduler import EXIT_CODE_TABLES
from rankguard.schema.jsontypes import JsonObject
from rankguard.straggler.config import StragglerConfig
from rankguard.util.configdoc import MAX_DEPTH, ConfigError, build
from rankguard.util.configdoc import load_yaml as _load_yaml
from rankguard.util.configdoc import short as _short

__all__ = [
    "ConfigError",
    "RankguardConfig",
    "apply_override",
    "build",
    "config_to_dict",
    "load_config",
    "run_config",
]

T = TypeVar("T")
logger = logging.getLogger(__name__)

_FLAGSCALE_PREFIX = ("experiment", "runner")


@dataclass(kw_only=True, slots=True, frozen=True)
class RankguardConfig:
    """Everything one ``rankguard run`` is configured with; frozen once validated (a
    change, such as the learned timeouts of :mod:`rankguard.ft.learned`, makes a new
    one with :func:`dataclasses.replace`)."""

    log_dir: str = field(
        default="rankguard_logs",
        metadata={"help": "Root of run directories: <log_dir>/heartbeat/<run_id>/."},
    )
    run_dir_mode: str | int = field(
        default="0750",
        metadata={
            "help": "Mode (octal, e.g. '0750') of the directories the launcher creates: "
            "log_dir, <log_dir>/heartbeat and the run directory; files keep 0644, so the "
            "group can read them and others cannot reach them."
        },
    )
    no_shared_fs: bool = field(
        default=True,
        metadata={
            "help": "Nodes do not share log_dir (the safe default): heartbeats and GPU "
            "health of nodes other than 0 reach node 0's monitor through the rendezvous "
            "store. false: every node writes into one shared log_dir and nothing is relayed."
        },
    )
    enable_gpu_health_check: bool = field(
        default=False,
        metadata={
            "help": "Before launching, check this node's GPUs (NVML, nvidia-smi) and refuse "
            "to start on an unhealthy one (FlagScale's switch)."
        },
    )
    enable_monitoring: bool | None = field(
        default=None,
        metadata={
            "help": "FlagScale's switch: true turns on heartbeat monitoring and the "
            "performance monitor, false turns both off; unset leaves each component's "
            "own 'enabled'."
        },
    )
    exit_codes: str = field(
        default="rankguard",
        metadata={
            "help": "'rankguard': the launcher's own exit codes; 'kubeflow': the retryable "
            "ones moved into 128-255, which Kubeflow's ExitCode restart policy retries "
            "(docs/kubernetes.md)."
        },
    )
    envs: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "Environment variables the launcher sets for itself and every rank "
            "(FlagScale's experiment.envs), NAME: value."
        },
    )
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    rerun_state_machine: RerunStateMachineConfig = field(default_factory=RerunStateMachineConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    inprocess_restart: InProcessRestartConfig = field(default_factory=InProcessRestartConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    node_health: NodeHealthConfig = field(default_factory=NodeHealthConfig)

    def __post_init__(self) -> None:
        if not self.log_dir:
            raise ConfigError("log_dir: must be a non-empty path")
        if isinstance(self.run_dir_mode, int) and 0 <= self.run_dir_mode <= 0o777:
            # YAML reads an unquoted 0750 as the octal number it is
            object.__setattr__(self, "run_dir_mode", f"0{self.run_dir_mode:o}")
        self.dir_mode()  # validates run_dir_mode
        try:
            object.__setattr__(self, "envs", check_envs(self.envs))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.exit_codes not in EXIT_CODE_TABLES:  # each scheduler's table
            tables = " or ".join(repr(t) for t in EXIT_CODE_TABLES)
            raise ConfigError(f"exit_codes: must be {tables}, got {self.exit_codes!r}")
        # The sections given are left as they are: what this config changes in them is
        # in new ones (validated again).
        hb: dict[str, Any] = {}  # the keyword arguments of dataclasses.replace()
        if self.enable_monitoring is not None:
            hb["enabled"] = self.enable_monitoring
            object.__setattr__(
                self, "perf", dataclasses.replace(self.perf, enabled=self.enable_monitoring)
            )
        ft = self.fault_tolerance
        # NVRx's heartbeat timeout names are the heartbeat monitor's timeouts (one
        # source of truth); set, they win, and the pair is validated again.
        if ft.initial_rank_heartbeat_timeout is not None:
            hb["initial_process_timeout_s"] = ft.initial_rank_heartbeat_timeout
        if ft.rank_heartbeat_timeout is not None:
            hb["process_timeout_s"] = ft.rank_heartbeat_timeout
        if hb:
            try:
                object.__setattr__(self, "heartbeat", dataclasses.replace(self.heartbeat, **hb))
            except ValueError as exc:
                raise ConfigError(f"heartbeat.{exc}") from exc

    def dir_mode(self) -> int:
        """``run_dir_mode`` as mode bits."""
        text = str(self.run_dir_mode)
        try:
            mode = int(text, 8) if isinstance(self.run_dir_mode, str) else -1
        except ValueError:
            mode = -1
        if not 3 <= len(text.removeprefix("0o")) <= 4 or not 0 <= mode <= 0o777:
            raise ConfigError(f"run_dir_mode: an octal mode such as '0750', got {text!r}")
        if mode & 0o700 != 0o700:
            raise ConfigError(
                f"run_dir_mode: the owner needs rwx (0700) on the run directory, got {text!r}"
            )
        return mode

    def warnings(self) -> list[str]:
        """Settings that are valid but do not do what they seem to: one message each,
        naming the keys (the launcher prints them before it starts anything)."""
        hb, ft = self.heartbeat, self.fault_tolerance
        out = []
        if not hb.enabled and hb.hardware_health.enabled:
            out.append(
                "heartbeat.hardware_health.enabled=true has NO effect while "
                "heartbeat.enabled=false: set heartbeat.enabled=true"
            )
        if ft.enable_ft_package and not hb.enabled:
            out.append(
                "fault_tolerance.enable_ft_package=true but heartbeat.enabled=false: hangs are "
                "NOT detected and will NOT be restarted; only crashes restart. Set "
                "heartbeat.enabled=true"
            )
        if self.perf.prometheus.enabled and not hb.enabled:
            out.append(
                "perf.prometheus.enabled=true has NO effect while heartbeat.enabled=false "
                "(the exporter serves the job monitor's state)"
            )
        out += self.checkpoint.warnings()
        out += self.perf.warnings()
        pre = self.preemption
        if pre.enable_exit_handler and not hb.enabled:
            out.append(
                "preemption.enable_exit_handler=true but heartbeat.enabled=false: the ranks "
                "cannot agree on a stop step (node 0's monitor chooses it), so NOTHING is "
                "saved on preemption; the ranks are killed at the end of preempt_time. Set "
                "heartbeat.enabled=true"
            )
        if pre.enable_exit_handler_for_data_loader and not pre.enable_exit_handler:
            out.append(
                "preemption.enable_exit_handler_for_data_loader=true has NO effect while "
                "preemption.enable_exit_handler=false"
            )
        ipr = self.inprocess_restart
        if ipr.enabled and hb.enabled and hb.progress_timeout_s <= ipr.soft_timeout:
            out.append(
                f"heartbeat.progress_timeout_s={hb.progress_timeout_s:g} <= "
                f"inprocess_restart.soft_timeout={ipr.soft_timeout:g}: the monitor reports "
                "(and fault tolerance restarts) a hang before the in-process restart can "
                "recover it; make progress_timeout_s larger than soft_timeout"
            )
        if not hb.enabled:
            out.append(
                "heartbeat monitoring is OFF (heartbeat.enabled=false): no liveness, progress "
                "or hang detection for this run"
            )
        out.extend(self.rerun_state_machine.warnings())
        if self.rerun_state_machine.enabled and not hb.enabled:
            out.append(
                "rerun_state_machine is on but heartbeat.enabled=false: re-runs happen, but "
                "their outcomes reach no finding, status or report (only the ranks' logs)"
            )
        return out


def config_to_dict(cfg: Any) -> JsonObject:
    """A config as the JSON object ``status.json`` snapshots."""
    snapshot: JsonObject = dataclasses.asdict(cfg)
    return snapshot


def _strip_flagscale_prefix(parts: list[str]) -> list[str]:
    if tuple(parts[:2]) == _FLAGSCALE_PREFIX:
        return parts[2:]
    return parts


def apply_override(doc: dict[str, object], override: str) -> None:
    """Apply one ``a.b.c=value`` override to a plain-dict config document.

    The value is parsed as a YAML scalar (``true``, ``5``, ``0.5``, ``null``, text).
    """
    import yaml  # here, not at the top: a rank reads its config as JSON

    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected key=value")
    key, raw = override.split("=", 1)
    key = key.strip().lstrip("+")  # Hydra's "+key=value" (add a key) reads the same here
    parts = _strip_flagscale_prefix([p for p in key.strip().split(".")])
    if not parts or any(not p for p in parts):
        raise ConfigError(f"override {_short(override)}: malformed key {_short(key)}")
    if len(parts) > MAX_DEPTH:
        raise ConfigError(f"override {_short(override)}: key nested deeper than {MAX_DEPTH} levels")
    try:
        if raw.lstrip().startswith("*"):
            value: Any = raw  # a glob (phase patterns), never a YAML alias on one line
        else:
            value = _load_yaml(raw, MAX_DEPTH - len(parts)) if raw.strip() else ""
    except ConfigError as exc:
        raise ConfigError(f"override {_short(override)}: value {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: cannot parse value: {exc}") from exc
    node = doc
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    defaults: Mapping[str, object] | None = None,
) -> RankguardConfig:
    """YAML file (optional) + overrides -> validated :class:`RankguardConfig`.
    ``defaults``: dotted keys set only where neither the file nor an override set them
    (``rankguard run``'s own defaults, e.g. heartbeats on)."""
    doc: dict[str, object] = {}
    if path is not None:
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"config file {p}: {exc.strerror or exc}") from exc
        try:
            loaded = _load_yaml(text)
        except ConfigError as exc:
            raise ConfigError(f"config file {p}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p}: top level must be a mapping")
        doc = loaded
    # FlagScale's experiment YAML and Megatron Bridge's names, read as they are (the
    # file's FlagScale runner first, so that overrides apply on top of it)
    own = frozenset(f.name for f in dataclasses.fields(RankguardConfig))
    try:
        doc, notes = unwrap_flagscale(doc, own)
        for ov in overrides:
            apply_override(doc, ov)
        doc, again = unwrap_flagscale(doc, own)  # FlagScale keys given as overrides
        doc, more = normalize(doc)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for line in dict.fromkeys((*notes, *again, *more)):  # a line said once
        logger.warning("rankguard: %s", line)
    for key, value in (defaults or {}).items():
        node: Any = doc
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict) and last not in node:
            node[last] = value
    return build(RankguardConfig, doc)


def dumps_config(cfg: RankguardConfig) -> str:
    return json.dumps(config_to_dict(cfg), sort_keys=True)


def run_config(env: runenv.RunEnv | None = None) -> RankguardConfig | None:
    """The validated config ``rankguard run`` gave this rank (``env``: default, this
    process's environment), decoded once per environment; None outside the launcher. A
    component that needs only its own section reads :meth:`runenv.RunEnv.section`."""
    env = env or runenv.current()
    text = env.config_text
    if not env.launcher or not text:
        return None
    return env.memo("config", lambda: loads_config(text))


def loads_config(text: str) -> RankguardConfig:
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ConfigError("config: nested too deeply") from None
    return build(RankguardConfig, doc)
