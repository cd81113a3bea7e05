"""NVRx ``ft_launcher``'s own flags on ``rankguard run``'s command line.

A Megatron-LM launch script written for ``ft_launcher`` passes, besides torchrun's
flags, ``--ft-<setting>`` flags in three spellings (``--ft-rank-section-timeouts``,
``--ft-rank_section_timeouts``, the older ``--ft-param-rank_section_timeouts``), a YAML
file (``--ft-cfg-path``), ``--term-timeout``, ``--restart-policy`` and a few more. Every
one of them is accepted here: the settings rankguard has become its
``fault_tolerance.*`` keys, the others are accepted with one warning line that says why
they have no effect under rankguard.

The flags and their meaning come from NVRx itself when ``nvidia-resiliency-ext`` is
installed: its launcher's parser (``get_args_parser()``) lists them and its
``FaultToleranceConfig.from_args`` reads them (YAML file first, flags over it, ``None``
for "no timeout" as in ``step:None``). Without NVRx, a frozen list of nvidia-resiliency-ext
0.4.1's flags (:data:`FROZEN`) and rankguard's own reading of their values stand in.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "FROZEN",
    "FROZEN_SOURCE",
    "NODE_HEALTH",
    "FtLauncherArgs",
    "LauncherFlag",
    "flag_for",
    "launcher_flags",
    "nvrx_version",
    "translate",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LauncherFlag:
    """One ``ft_launcher`` flag that torchrun does not have."""

    dest: str
    options: tuple[str, ...]
    takes_value: bool = True


FROZEN_SOURCE = "nvidia-resiliency-ext 0.4.1 to 0.7.0 (frozen list)"
FROZEN: tuple[LauncherFlag, ...] = (
    LauncherFlag("term_timeout", ("--term-timeout", "--term_timeout")),
    LauncherFlag("workers_stop_timeout", ("--workers-stop-timeout", "--workers_stop_timeout")),
    LauncherFlag("ft_cfg_path", ("--ft-cfg-path", "--ft-cfg_path", "--fault-tol-cfg-path")),
    *(
        LauncherFlag(
            f"ft_{name}",
            (
                f"--ft-{name.replace('_', '-')}",
                f"--ft-{name}",
                f"--ft-param-{name}",
            ),
        )
        for name in (
            "workload_check_interval",
            "initial_rank_heartbeat_timeout",
            "rank_heartbeat_timeout",
            "node_health_check_interval",
            "safety_factor",
            "rank_termination_signal",
            "log_level",
            "rank_out_of_section_timeout",
            "rank_section_timeouts",
            "restart_check_interval",
        )
    ),
    LauncherFlag(
        "ft_restart_policy",
        ("--ft-restart-policy", "--ft-restart_policy", "--restart-policy", "--restart_policy"),
    ),
    *(
        LauncherFlag(
            f"ft_{name}",
            (
                f"--ft-{name.replace('_', '-')}",
                f"--ft-{name}",
                f"--ft-param-{name.replace('_', '-')}",
                f"--ft_param_{name}",
            ),
        )
        for name in ("enable_nic_monitor", "pci_topo_file", "link_down_path_template")
    ),
    LauncherFlag("ft_ignore_missing_cfg", ("--ignore-missing-fault-tol-cfg",), False),
    # added by nvidia-resiliency-ext 0.5 to 0.7 (0.7.0's parser, as it spells them)
    *(
        LauncherFlag(f"ft_{name}", (f"--ft-{name.replace('_', '-')}", f"--ft_{name}"))
        for name in (
            "segment",
            "per_cycle_applog_prefix",
            "nvrx_logfile",
            "enable_log_server",
            "log_server_port",
            "log_aggregator_count",
            "log_leaf_max_queue_chunks",
            "log_server_log_prefix",
            "log_server_graceful_shutdown_timeout",
            "enable_dist_storage_healthcheck",
            "segment_health_check_dir",
            "attribution_endpoint",
            "attribution_startup_timeout",
            "attribution_llm_api_key_file",
            "attribution_llm_base_url",
            "attribution_llm_model",
            "attribution_analysis_backend",
            "attribution_stop_action",
            "attribution_log_level",
            "attribution_export_url",
            "no_restart_exit_code",
            "cycle_info_dir",
        )
    ),
    *(
        LauncherFlag(f"ft_{name}", (f"--ft-{name.replace('_', '-')}", f"--ft-{name}"))
        for name in (
            "node_health_check_endpoint",
            "enable_nic_healthcheck",
            "link_state_path_template",
            "skip_section_response",
            "rdzv_impl",
            "numa_bind_strict",
            "gpu_memory_reclaim_timeout",
            "gpu_memory_tolerance_mb",
            "gpu_memory_poll_interval",
            "check_remaining_processes",
            "install_exception_hook",
            "max_no_progress_cycles",
            "min_progress_iterations",
            "checkpoint_iteration_file",
        )
    ),
    LauncherFlag(
        "ft_storage_healthcheck_path",
        ("--ft-storage-health-check-path", "--ft_storage_health_check_path"),
    ),
    LauncherFlag("ft_ignore_missing_cfg", ("--ft-ignore-missing-cfg",), False),
)

# NVRx FaultToleranceConfig field -> rankguard key (same meaning)
MAPPED = {
    "initial_rank_heartbeat_timeout": "fault_tolerance.initial_rank_heartbeat_timeout",
    "rank_heartbeat_timeout": "fault_tolerance.rank_heartbeat_timeout",
    "safety_factor": "fault_tolerance.safety_factor",
    "rank_out_of_section_timeout": "fault_tolerance.rank_out_of_section_timeout",
    "rank_section_timeouts": "fault_tolerance.rank_section_timeouts",
    "max_no_progress_cycles": "fault_tolerance.max_no_progress_cycles",
}
# accepted, no effect: why
NO_EFFECT = {
    "workload_check_interval": "rankguard's monitor checks every heartbeat.scan_interval_s",
    "node_health_check_interval": (
        "GPU health is collected every heartbeat.hardware_health.interval_s"
    ),
    "rank_termination_signal": ("rankguard dumps the culprit's stacks, then kills it with SIGKILL"),
    "log_level": "rankguard logs at INFO (-v for DEBUG)",
    "restart_check_interval": "rankguard restarts through torch elastic's own restart path",
    "pci_topo_file": (
        "rankguard checks every physical link before each round (node_health.nic); it "
        "pairs no NIC with a GPU"
    ),
    "link_down_path_template": (
        "rankguard reads each link's state in sysfs (node_health.nic, node_health.sysfs_root)"
    ),
    "term_timeout": (
        "on SIGTERM rankguard follows preemption.* (graceful preemption) or torch elastic's "
        "own shutdown"
    ),
    "workers_stop_timeout": "workers are stopped within fault_tolerance.termination_grace_s",
    "ignore_missing_cfg": "nothing to ignore: a missing --ft-cfg-path is an error",
    "restart_policy": "rankguard restarts the group when any worker failed (any-failed)",
    # nvidia-resiliency-ext 0.5 to 0.7
    "segment": (
        "rankguard's spare nodes (--nnodes MIN:MAX) take any failed node's place; it does "
        "not group nodes by NVLink domain"
    ),
    "per_cycle_applog_prefix": (
        "each start's rank logs are under the run directory (rank_logs_node_<n>.json lists them)"
    ),
    "nvrx_logfile": "rankguard logs to the launcher's stderr and the run directory",
    "enable_log_server": "each node writes its ranks' logs itself; there is no log server",
    "log_server_port": "each node writes its ranks' logs itself; there is no log server",
    "log_aggregator_count": "each node writes its ranks' logs itself; there is no log server",
    "log_leaf_max_queue_chunks": "each node writes its ranks' logs itself; there is no log server",
    "log_server_log_prefix": "each node writes its ranks' logs itself; there is no log server",
    "log_server_graceful_shutdown_timeout": (
        "each node writes its ranks' logs itself; there is no log server"
    ),
    "node_health_check_endpoint": (
        "rankguard checks the node's GPUs itself (heartbeat.hardware_health)"
    ),
    "link_state_path_template": (
        "rankguard reads every InfiniBand port's state under /sys/class/infiniband "
        "(node_health.nic, node_health.sysfs_root)"
    ),
    "segment_health_check_dir": "rankguard keeps no segment health decisions",
    "skip_section_response": (
        "rankguard's bridge sends the client NVRx's default and answers as it says"
    ),
    "rdzv_impl": "rankguard rendezvous through torch elastic's --rdzv-backend",
    "numa_bind_strict": "rankguard binds no NUMA nodes (use numactl in the script's launch)",
    "gpu_memory_reclaim_timeout": (
        "rankguard restarts the group without waiting for GPU memory to be released"
    ),
    "gpu_memory_tolerance_mb": (
        "rankguard restarts the group without waiting for GPU memory to be released"
    ),
    "gpu_memory_poll_interval": (
        "rankguard restarts the group without waiting for GPU memory to be released"
    ),
    "check_remaining_processes": "rankguard stops workers through torch elastic's own shutdown",
    "install_exception_hook": (
        "a rank's uncaught exception is recorded by torch elastic's error file, named by "
        "rankguard as the root cause"
    ),
    "attribution_endpoint": "rankguard names the root cause itself (findings); calls no service",
    "attribution_startup_timeout": "rankguard calls no attribution service",
    "attribution_llm_api_key_file": "rankguard calls no attribution service",
    "attribution_llm_base_url": "rankguard calls no attribution service",
    "attribution_llm_model": "rankguard calls no attribution service",
    "attribution_analysis_backend": "rankguard calls no attribution service",
    "attribution_stop_action": "rankguard calls no attribution service",
    "attribution_log_level": "rankguard calls no attribution service",
    "attribution_export_url": "rankguard calls no attribution service",
    "no_restart_exit_code": (
        "rankguard's own exit codes apply: 12 when a fault's action ended the job without "
        "a restart (see rankguard's exit code table)"
    ),
    "cycle_info_dir": (
        "rankguard writes no cycle info files; the restarts are in the run directory's status.json"
    ),
    "min_progress_iterations": (
        "rankguard counts an attempt as progress when it got past the highest iteration "
        "reached before it (fault_tolerance.max_no_progress_restarts)"
    ),
    "checkpoint_iteration_file": (
        "rankguard reads each attempt's progress from the ranks' heartbeats, not from a file"
    ),
}
# NVRx's node checks before the rendezvous -> rankguard's (node_health): the NIC link
# state (0.4's NIC monitor too), the storage check and its directories
NODE_HEALTH = (
    "enable_nic_monitor",
    "enable_nic_healthcheck",
    "enable_dist_storage_healthcheck",
    "storage_healthcheck_path",
)
_DEFAULT_RESTART_POLICY = "any-failed"
# ft_launcher acts on what it detects (the hung rank is ended, the group restarted within
# --max-restarts, or the job fails): its flags on a launch line ask for that behaviour
# (the console's first line then says "fault tolerance on"); the launch line's own
# fault_tolerance.enable_ft_package=false keeps the findings and takes no action
FT_ON = "fault_tolerance.enable_ft_package=true"


def nvrx_version() -> tuple[int, ...] | None:
    """The installed ``nvidia-resiliency-ext`` version, or None when it is absent."""
    try:
        text = importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def launcher_flags() -> tuple[tuple[LauncherFlag, ...], str]:
    """``ft_launcher``'s flags that torchrun lacks, and where the list came from: the
    installed NVRx's own parser, else :data:`FROZEN`."""
    try:
        from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser
        from torch.distributed.run import get_args_parser as torchrun_parser
    except Exception:
        return FROZEN, FROZEN_SOURCE
    torch_dests = {a.dest for a in torchrun_parser()._actions}
    flags = tuple(
        LauncherFlag(a.dest, tuple(a.option_strings), a.nargs != 0)
        for a in get_args_parser()._actions
        if a.option_strings and a.dest not in torch_dests
    )
    # settings another release has (0.7's flags under 0.4.1) are accepted too; a setting
    # this parser has keeps this parser's spellings (its from_args reads only those)
    have = {o for f in flags for o in f.options}
    dests = {f.dest for f in flags}
    flags += tuple(
        dataclasses.replace(f, options=tuple(o for o in f.options if o not in have))
        for f in FROZEN
        if (f.dest not in dests or not f.takes_value) and any(o not in have for o in f.options)
    )
    version = ".".join(map(str, nvrx_version() or ()))
    return flags, f"nvidia-resiliency-ext {version} (its launcher's parser)"


def flag_for(option: str, flags: Iterable[LauncherFlag] | None = None) -> LauncherFlag | None:
    """The ``ft_launcher`` flag an option string (without ``=value``) names, or None."""
    for flag in FROZEN if flags is None else flags:
        if option in flag.options:
            return flag
    return None


@dataclass(slots=True)
class FtLauncherArgs:
    """What the ``ft_launcher`` flags of a command line mean under rankguard."""

    sets: list[str] = field(default_factory=list)  # rankguard ``key=value`` overrides
    warnings: list[str] = field(default_factory=list)  # one line per flag without effect


def _plain_value(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return "none" if value is None else str(value)


def _find_ft_section(data: Any) -> dict[str, object] | None:
    if isinstance(data, dict):
        if isinstance(data.get("fault_tolerance"), dict):
            return data["fault_tolerance"]
        items: Iterable[Any] = data.values()
    elif isinstance(data, list):
        items = data
    else:
        return None
    for item in items:
        found = _find_ft_section(item)
        if found is not None:
            return found
    return None


def _yaml_settings(path: str) -> dict[str, object]:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--ft-cfg-path {path}: {exc.strerror or exc}") from exc
    try:
        section = _find_ft_section(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise ValueError(f"--ft-cfg-path {path}: not valid YAML ({exc})") from exc
    if section is None:
        raise ValueError(f"--ft-cfg-path {path}: no 'fault_tolerance' section")
    return dict(section)


def _refuse(message: str) -> NoReturn:
    """NVRx's parser refusing a value (an invalid choice: 0.7 takes ``any-failed`` as the
    only restart policy) is a ValueError here: argparse's own ``error`` would print its
    usage and exit the launcher in the middle of reading its command line."""
    raise ValueError(message)


def _nvrx_settings(given: dict[str, str | None]) -> dict[str, object] | None:
    """NVRx's own reading of the flags (its parser and ``from_args``); None without NVRx."""
    try:
        from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
        from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser
    except Exception:
        return None
    argv: list[str] = []
    for option, value in given.items():
        argv += [option] if value is None else [f"{option}={value}"]
    parser = get_args_parser()
    parser.error = _refuse  # a refusal, not sys.exit
    ns, _ = parser.parse_known_args([*argv, "script.py"])
    cfg = FaultToleranceConfig.from_args(ns)
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def translate(given: dict[str, str | None], flags: Iterable[LauncherFlag]) -> FtLauncherArgs:
    """``given``: option string -> its value (None for a switch), for ``ft_launcher``
    flags only. ValueError for a value NVRx itself would refuse."""
    by_option = {o: f for f in flags for o in f.options}
    out = FtLauncherArgs()
    if given:
        out.sets.append(FT_ON)  # the launch line's own --ft-*/--set words come after it
    # each setting once, in the order given: the flags' own text (rankguard reads
    # "600", "setup:600,step:180" as NVRx does), the file's values under them
    settings: dict[str, object] = {}
    cfg_path = next((v for o, v in given.items() if by_option[o].dest == "ft_cfg_path" and v), None)
    for option, value in given.items():
        dest = by_option[option].dest
        if dest != "ft_cfg_path":
            settings[dest.removeprefix("ft_")] = value
    from_file: dict[str, object] = _yaml_settings(cfg_path) if cfg_path else {}
    try:  # NVRx's own reading: refuses what NVRx refuses, types the file's values
        nvrx = _nvrx_settings(
            {o: v for o, v in given.items() if by_option[o].dest != "ft_ignore_missing_cfg"}
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(f"ft_launcher flags: {exc}") from exc
    for name, in_file in from_file.items():
        if name not in settings:
            settings[name] = nvrx[name] if nvrx is not None and name in nvrx else in_file
    out.sets += _node_health({n: settings.pop(n) for n in NODE_HEALTH if n in settings})
    named = list(settings)
    for name in named:
        setting: Any = settings.get(name)
        if name in MAPPED:
            if name == "rank_section_timeouts":
                setting = _sections(setting, out)
                if not setting:
                    continue
            out.sets.append(f"{MAPPED[name]}={_plain_value(setting)}")
        elif name == "restart_policy" and str(setting) == _DEFAULT_RESTART_POLICY:
            continue  # rankguard's own behaviour
        elif name in NO_EFFECT:
            out.warnings.append(
                f"ft_launcher's {name}={_plain_value(setting)} has no effect under rankguard: "
                f"{NO_EFFECT[name]}"
            )
        else:  # a setting a later NVRx added
            out.warnings.append(
                f"ft_launcher's {name}={_plain_value(setting)} has no effect under rankguard"
            )
    return out


def _sections(value: Any, out: FtLauncherArgs) -> dict[str, object]:
    """Section timeouts; NVRx's ``None`` (no timeout) for a section is said once."""
    if isinstance(value, str):
        parsed: dict[str, object] = {}
        for item in filter(None, (p.strip() for p in value.split(","))):
            name, sep, timeout = item.partition(":")
            if not sep:
                raise ValueError(f"rank_section_timeouts: expected name:seconds, got {item!r}")
            low = timeout.strip().lower()
            parsed[name.strip()] = None if low in ("none", "null", "") else timeout.strip()
        value = parsed
    if not isinstance(value, dict):
        raise ValueError(f"rank_section_timeouts: expected a mapping, got {value!r}")
    kept = {k: v for k, v in value.items() if v is not None}
    for name in (k for k, v in value.items() if v is None):
        instead = {
            "step": "heartbeat.progress_timeout_s",
            "setup": "heartbeat.initial_progress_timeout_s",
            "checkpointing": "heartbeat.checkpoint_timeout_s",
        }.get(name, "fault_tolerance.rank_out_of_section_timeout, if set")
        out.warnings.append(
            f"ft_launcher's rank_section_timeouts {name}:None (no timeout for that section): "
            f"under rankguard {instead} still applies there"
        )
    return kept


def _on(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _node_health(given: dict[str, object]) -> list[str]:
    """NVRx's NIC and storage checks as rankguard's ``node_health`` settings: the checks
    asked for run (each node, before every round), the others stay off."""
    nic = any(_on(given.get(n)) for n in ("enable_nic_monitor", "enable_nic_healthcheck"))
    given_paths = given.get("storage_healthcheck_path")
    parts = [p.strip() for p in str(given_paths or "").split(",") if p.strip()]
    for part in parts:  # as NVRx 0.7 refuses them
        if not part.startswith("/"):
            raise ValueError(
                f"--ft-storage-health-check-path: path must be absolute starting with '/': {part}"
            )
    paths = ",".join(parts)
    storage = _on(given.get("enable_dist_storage_healthcheck")) or bool(paths)
    if not nic and not storage:
        return []
    out = ["node_health.enabled=true", f"node_health.nic={str(nic).lower()}"]
    out.append(f"node_health.storage={str(storage).lower()}")
    if paths:
        out.append(f"node_health.storage_paths={paths}")
    return out
