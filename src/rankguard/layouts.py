"""Config documents of the tools rankguard replaces, read as they are.

rankguard's own layout has one section per component (``heartbeat``, ``fault_tolerance``,
``straggler``, ``checkpoint``, ...), read strictly. Two other layouts are accepted whole:

- **FlagScale's experiment YAML** (``defaults``, ``experiment: {exp_name, exp_dir, task,
  runner: {...}, envs, cmds}``, ``action``, ``train``, ``hydra``), as FlagScale means it:
  rankguard reads its own keys in ``experiment.runner`` (``heartbeat``,
  ``enable_monitoring``, ``enable_gpu_health_check``, ``no_shared_fs``, and any other
  rankguard section placed there) strictly; ``experiment.envs`` (and the runner's
  ``envs``) become ``envs``, set for the launcher and every rank as FlagScale exports them
  (each value as Python's ``str`` writes it); ``experiment.exp_dir`` makes ``log_dir``
  ``<exp_dir>/logs`` (unless the runner sets ``log_dir``; ``--log-dir`` wins), so the
  heartbeat files land in FlagScale's ``<exp_dir>/logs/heartbeat/<run_id>/`` and rank 0's
  perf summary is also at FlagScale's ``<exp_dir>/logs/perf_monitor/perf_summary_<ts>.json``
  (a link into the run's folder: :mod:`rankguard.perf.flagscale`). ``action=run`` is
  accepted (another action is refused); the training section (``train``, ``defaults``'
  ``train: <name>``, ``train.data.data_path=...`` overrides) is said in one line: rankguard
  launches the script with its own arguments and renders no training command. The
  runner's launch settings (``backend``, ``nnodes``, ``nproc_per_node``, ``hostfile``,
  ``ssh_port``, ``cmds``, ...) are said in one line: the launch line decides them under
  rankguard. A runner key that looks like a misspelt rankguard section (``heartbeet``)
  is an error naming the real one.
- **Megatron Bridge's ``ConfigContainer``** (as ``cfg.to_yaml()`` writes it): ``ft`` is
  ``fault_tolerance``, ``nvrx_straggler`` is ``straggler`` (NVRx's detector),
  ``train.exit_signal_handler``/``exit_signal``/``exit_signal_handler_for_dataloader`` are
  ``preemption``'s, ``rerun_state_machine``, ``inprocess_restart`` and ``checkpoint`` keep
  their names; ``fault_tolerance.state_dir`` defaults to ``checkpoint.save``, where
  Bridge keeps NVRx's ``ft_state.json``. Bridge's fields that rankguard does not act on
  are accepted; one line each says so when they are set to something other than
  Bridge's default. Bridge's sections for the training script (``model``, ``optimizer``,
  ``dataset``, ...) are left alone, and so is the legacy ``straggler`` detector's
  section (said once when it is enabled).

Both work in a file and in ``key=value`` overrides (``ft.enable_ft_package=true``,
``experiment.runner.heartbeat.enabled=true``). Bridge's defaults of the fields below come
from megatron-bridge 0.3.1's ``megatron/bridge/training/config.py``.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any

from rankguard.schema.coerce import as_dict

__all__ = [
    "BRIDGE_ONLY",
    "BRIDGE_SCRIPT_SECTIONS",
    "FLAGSCALE_RUNNER_SETTINGS",
    "FLAGSCALE_TRAIN_NOTE",
    "check_envs",
    "normalize",
    "unwrap_flagscale",
]

# Megatron Bridge ConfigContainer sections that configure the training script itself
BRIDGE_SCRIPT_SECTIONS = frozenset(
    {
        "rng",
        "model",
        "optimizer",
        "optimizer_config_override_provider",
        "ddp",
        "scheduler",
        "dataset",
        "logger",
        "tokenizer",
        "dist",
        "profiling",
        "peft",
        "comm_overlap",
        "mixed_precision",
        "tensor_inspect",
    }
)
# Bridge's fields rankguard accepts without acting on them, with Bridge's default
BRIDGE_ONLY: dict[str, dict[str, object]] = {
    "checkpoint": {
        "save_optim": True,
        "save_rng": True,
        "load": None,
        "load_optim": True,
        "load_main_params_from_ckpt": False,
        "load_rng": True,
        "non_persistent_global_ckpt_dir": None,
        "finetune": False,
        "pretrained_checkpoint": None,
        "ckpt_step": None,
        "use_checkpoint_args": False,
        "exit_on_missing_checkpoint": False,
        "ckpt_convert_format": None,
        "ckpt_convert_save": None,
        "fully_parallel_save": True,
        "use_persistent_ckpt_worker": True,
        "fully_parallel_load": False,
        "ckpt_assume_constant_structure": False,
        "strict_fsdp_dtensor_load": False,
        "dist_ckpt_strictness": "assume_ok_unexpected",
        "dist_ckpt_optim_fully_reshardable": False,
        "distrib_optim_fully_reshardable_mem_efficient": False,
        "save_tokenizer_assets": True,
    },
    "inprocess_restart": {
        "monitor_process_interval": 1.0,
        "progress_watchdog_interval": 1.0,
        "last_call_wait": 1.0,
        "termination_grace_time": 1.0,
        "active_world_size": None,
        "max_rank_faults": None,
        "monitor_process_logdir": None,
    },
    "straggler": {"logger_name": "megatron.bridge.NVRxStragglerDetection"},
}
_WHY = {
    "checkpoint": "rankguard's checkpoint library saves model, optimizer and RNG state and "
    "resumes from checkpoint.save",
    "inprocess_restart": "rankguard's in-process restart re-enters every rank",
    "straggler": "rankguard reports stragglers in its own findings and log lines",
}
_BRIDGE_ROOT_ALIASES = {"ft": "fault_tolerance", "nvrx_straggler": "straggler"}
_BRIDGE_TRAIN_KEYS = {
    "exit_signal_handler": "exit_signal_handler",
    "exit_signal": "exit_signal",
    "exit_signal_handler_for_dataloader": "exit_signal_handler_for_dataloader",
}
_LEGACY_STRAGGLER = frozenset(
    {
        "log_straggler",
        "enable_straggler_on_startup",
        "straggler_ctrlr_port",
        "straggler_minmax_count",
        "disable_straggler_on_startup",
    }
)
# FlagScale's runner settings (the launch line decides them under rankguard)
FLAGSCALE_RUNNER_SETTINGS = frozenset(
    {
        "backend",
        "nnodes",
        "nproc_per_node",
        "hostfile",
        "ssh_port",
        "cmds",
        "docker",
        "rdzv_backend",
        "rdzv_endpoint",
        "master_addr",
        "master_port",
        "node_rank",
        "per_node_task",
        "device_type_specific",
    }
)


# FlagScale's training section: a mapping of these (Megatron Bridge's ``train`` is flat)
_FLAGSCALE_TRAIN_PARTS = frozenset({"system", "model", "data"})
FLAGSCALE_TRAIN_NOTE = (
    "FlagScale's training section (train, train.*=... overrides) is not rendered under "
    "rankguard: rankguard run launches the script with the arguments after it on its "
    "command line"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_envs(envs: Any, where: str = "envs") -> dict[str, str]:
    """Environment variables from a config: names as the shell takes them, each value a
    scalar written as FlagScale's ``export NAME=value`` writes it (Python's ``str``)."""
    if envs is None:
        return {}
    if not isinstance(envs, dict):
        raise ValueError(f"{where}: expected a mapping of NAME: value")
    out: dict[str, str] = {}
    for name, value in envs.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ValueError(f"{where}.{name}: not an environment variable name")
        if value is None or isinstance(value, dict | list):
            raise ValueError(f"{where}.{name}: expected a value (text or number), got {value!r}")
        out[name] = str(value)
    return out


def _is_flagscale_train(train: Any) -> bool:
    return isinstance(train, dict) and bool(_FLAGSCALE_TRAIN_PARTS & set(train))


def _flagscale_roots(doc: dict[str, object], flagscale: bool) -> list[str]:
    """FlagScale's own root keys, removed from ``doc``: ``action`` (``run`` only),
    ``hydra``, ``defaults`` and the training section (one line). ``flagscale``: the
    document is an experiment file (its ``train`` is FlagScale's whatever its shape)."""
    notes: list[str] = []
    if "action" in doc:
        action = doc.pop("action")
        if action != "run":
            raise ValueError(
                f"action={action}: rankguard run runs the job (FlagScale's action=run); "
                "other actions are FlagScale's own"
            )
    if flagscale:
        doc.pop("hydra", None)
        defaults = doc.pop("defaults", None)
        picks_train = isinstance(defaults, list) and any(
            isinstance(d, dict) and "train" in d for d in defaults
        )
        if doc.pop("train", None) is not None or picks_train:
            notes.append(FLAGSCALE_TRAIN_NOTE)
    elif _is_flagscale_train(doc.get("train")):
        doc.pop("train")
        notes.append(FLAGSCALE_TRAIN_NOTE)
    return notes


def unwrap_flagscale(
    doc: dict[str, object], own: frozenset[str]
) -> tuple[dict[str, object], list[str]]:
    """The rankguard part of a FlagScale experiment document (``experiment.runner``, and
    rankguard's own root keys ``own`` beside it, e.g. from overrides; ``envs`` and
    ``log_dir`` from ``experiment.envs`` and ``experiment.exp_dir``), and the lines that
    say what rankguard leaves to FlagScale; other documents as they are (less
    FlagScale's ``action=run`` and training overrides, given on the command line).
    ValueError for a runner key that is a misspelt rankguard key, another action, or
    envs that are not ``NAME: value``."""
    experiment = doc.get("experiment")
    doc = dict(doc)
    if "envs" in doc:  # rankguard's own key (a file, envs.NAME=value): values as text
        doc["envs"] = check_envs(doc["envs"])
    notes = _flagscale_roots(doc, experiment is not None)
    if experiment is None:
        return doc, notes
    if not isinstance(experiment, dict):
        raise ValueError("experiment: expected a mapping with a 'runner' block (FlagScale)")
    runner = experiment.get("runner") or {}
    if not isinstance(runner, dict):
        raise ValueError("experiment.runner: expected a mapping")
    out: dict[str, object] = {k: v for k, v in doc.items() if k in own}
    theirs: list[str] = []
    for key, value in runner.items():
        if key in own:
            out[key] = value
            continue
        if key == "envs":
            continue
        close = difflib.get_close_matches(key, sorted(own), n=1, cutoff=0.8)
        if close and key not in FLAGSCALE_RUNNER_SETTINGS:
            raise ValueError(
                f"experiment.runner.{key}: not a rankguard setting; did you mean "
                f"experiment.runner.{close[0]}?"
            )
        theirs.append(key)
    envs = {
        **check_envs(experiment.get("envs"), "experiment.envs"),
        **check_envs(runner.get("envs"), "experiment.runner.envs"),
    }
    if envs:
        out["envs"] = {**envs, **check_envs(out.get("envs"))}  # rankguard's own key wins
    exp_dir = experiment.get("exp_dir")
    if exp_dir is not None:
        if not isinstance(exp_dir, str) or not exp_dir:
            raise ValueError(f"experiment.exp_dir: expected a directory, got {exp_dir!r}")
        if "log_dir" not in runner:
            out["log_dir"] = os.path.join(exp_dir, "logs")  # FlagScale's <exp_dir>/logs
        perf = out.get("perf")
        if perf is None or isinstance(perf, dict):
            out["perf"] = {"flagscale_summary_link": True, **(perf or {})}
    if experiment.get("cmds"):
        notes.append(
            "FlagScale's experiment.cmds (before_start, ...) are not run under rankguard: "
            "run them before rankguard run"
        )
    if theirs:
        notes.append(
            "FlagScale's runner settings "
            + ", ".join(f"experiment.runner.{k}" for k in theirs)
            + " have no effect under rankguard (the rankguard run command line sets nodes, "
            "ranks and the rendezvous)"
        )
    return out, notes


def _from_bridge_yaml(value: Any) -> Any:
    """A value as Megatron Bridge's ``to_yaml()`` wrote it, made plain: an enum is
    ``{_target_: signal.Signals, _call_: true, _args_: [15]}`` (its value), a dataclass
    carries ``_target_`` (dropped)."""
    if isinstance(value, dict):
        if value.get("_call_") is True and isinstance(value.get("_args_"), list):
            args = value["_args_"]
            if len(args) == 1 and not isinstance(args[0], dict | list):
                return args[0]
        return {
            k: _from_bridge_yaml(v)
            for k, v in value.items()
            if not (isinstance(k, str) and k.startswith("_") and k.endswith("_"))
        }
    return value


_BRIDGE_READ = frozenset(
    {"ft", "nvrx_straggler", "straggler", "train", "checkpoint"}
    | {"rerun_state_machine", "inprocess_restart"}
)


def normalize(doc: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    """rankguard's layout from a document that may use Megatron Bridge's names (after
    the overrides were applied), and one line per setting accepted without effect."""
    bridge_doc = "_target_" in doc or bool(
        (BRIDGE_SCRIPT_SECTIONS | set(_BRIDGE_ROOT_ALIASES) | {"train"}) & set(doc)
    )
    doc = {
        k: _from_bridge_yaml(v) if k in _BRIDGE_READ else v
        for k, v in doc.items()
        if k != "_target_"  # Bridge's ConfigContainer class
    }
    notes: list[str] = []
    legacy = doc.get("straggler")
    if isinstance(legacy, dict) and _LEGACY_STRAGGLER & set(legacy):
        doc.pop("straggler")
        if legacy.get("log_straggler"):
            notes.append(
                "Megatron Bridge's legacy straggler detector (straggler.log_straggler) has "
                "no effect under rankguard: its straggler detection is NVRx's "
                "(nvrx_straggler.enabled=true)"
            )
    for alias, name in _BRIDGE_ROOT_ALIASES.items():
        if alias not in doc:
            continue
        section = doc.pop(alias)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ValueError(f"{alias}: expected a mapping (Megatron Bridge's {name})")
        own = doc.get(name)
        if own is not None and not isinstance(own, dict):
            raise ValueError(f"{name}: expected a mapping")
        doc[name] = {**section, **(own or {})}  # rankguard's own name wins
    train = doc.pop("train", None)
    if isinstance(train, dict):
        picked = {_BRIDGE_TRAIN_KEYS[k]: v for k, v in train.items() if k in _BRIDGE_TRAIN_KEYS}
        if picked:
            own = doc.get("preemption")
            if own is not None and not isinstance(own, dict):
                raise ValueError("preemption: expected a mapping")
            doc["preemption"] = {**picked, **(own or {})}
    elif train is not None:
        raise ValueError("train: expected a mapping (Megatron Bridge's training config)")
    for key in BRIDGE_SCRIPT_SECTIONS & set(doc):
        doc.pop(key)  # the training script's own configuration
    ckpt = doc.get("checkpoint")
    if bridge_doc and isinstance(ckpt, dict) and ckpt.get("most_recent_k") == -1:
        doc["checkpoint"] = {**ckpt, "most_recent_k": None}  # Bridge's -1: keep them all
    ft = doc.get("fault_tolerance")
    unset = ft is None or (isinstance(ft, dict) and ft.get("state_dir") is None)
    if bridge_doc and unset and isinstance(ckpt, dict) and isinstance(ckpt.get("save"), str):
        # Bridge keeps NVRx's ft_state.json in checkpoint.save: rankguard reads it there
        doc["fault_tolerance"] = {**(as_dict(ft) or {}), "state_dir": ckpt["save"]}
    for section, fields in BRIDGE_ONLY.items():
        block = doc.get(section)
        if not isinstance(block, dict):
            continue
        block = dict(block)
        changed = []
        for key, default in fields.items():
            if key in block:
                value = block.pop(key)
                if value != default:
                    changed.append(f"{section}.{key}={value!r}")
        doc[section] = block
        if changed:
            notes.append(
                "Megatron Bridge's "
                + ", ".join(changed)
                + f" {'has' if len(changed) == 1 else 'have'} no effect under rankguard: "
                + _WHY[section]
            )
    return doc, notes
