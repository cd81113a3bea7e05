"""The pre-pass over ``rankguard run``'s command line, without importing torch.

torch's own parser (``torch.distributed.run.get_args_parser()``) decides the launch
flags, but importing it costs seconds. A mistake in rankguard's own part of the line
(a config key, a malformed YAML file, an unwritable ``log_dir``) should be said at once,
so this pass reads only rankguard's words: ``--config``, ``--set``, the bare
``KEY=VALUE`` overrides before the script, NVRx's ``--ft-<key>`` flags, and the
``--log-dir`` that also roots rankguard's files when the configuration names none.

It knows torch's flags by one fact only: which of them take no value
(:data:`TORCH_SWITCHES`, checked against the installed torch by a test); any other
option is read as taking one. A torch flag added later is still parsed right by the
full pass; if this pass took it for a value flag wrongly, the full pass's overrides
differ and the configuration is loaded again from them (:func:`rankguard.cli.main`).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field

__all__ = [
    "OWN_SWITCHES",
    "OWN_VALUE_FLAGS",
    "TORCH_SWITCHES",
    "PrePass",
    "is_override",
    "nvrx_flags",
    "pre_pass",
    "split_overrides",
]

# ``a.b=value``, and Hydra's ``+a.b=value`` / ``++a.b=value`` (add or force: the same here)
_OVERRIDE_RE = re.compile(r"^\+{0,2}[A-Za-z_][A-Za-z0-9_.]*=")

TORCH_SWITCHES = frozenset(
    {
        "-h",
        "--help",
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)
"""torchrun's options that take no value (every other one takes one)."""

OWN_VALUE_FLAGS = frozenset({"--config", "--set", "--preload", "--run-id", "--rdzv-join-timeout"})
OWN_SWITCHES = frozenset({"--live", "--rank-prefix"})

_LOG_DIR_FLAGS = frozenset({"--log-dir", "--log_dir"})
_NO_PYTHON_FLAGS = frozenset({"--no-python", "--no_python"})
_NPROC_FLAGS = frozenset({"--nproc-per-node", "--nproc_per_node"})


def is_override(word: str) -> bool:
    """A ``KEY=VALUE`` config override word (not a script path)."""
    return bool(_OVERRIDE_RE.match(word)) and not word.endswith(".py")


def split_overrides(target: str, rest: list[str]) -> tuple[list[str], str, list[str]]:
    """Leading ``a.b=value`` words before the script are config overrides."""
    words = [target, *rest]
    overrides = []
    while words and is_override(words[0]):
        overrides.append(words.pop(0))
    if not words:
        raise ValueError("no training script given after the config overrides")
    return overrides, words[0], words[1:]


def _takes_value(word: str) -> bool:
    """An option word (no ``=``) whose value is the next word."""
    if word in TORCH_SWITCHES or word in OWN_SWITCHES:
        return False
    # ``-r3``: a short option with its value attached
    return word.startswith("--") or len(word) <= 2


@dataclass(slots=True)
class PrePass:
    """rankguard's own part of a ``rankguard run`` line."""

    config: str | None = None
    overrides: list[str] = field(default_factory=list)  # lowest precedence first
    no_python: bool = False
    has_script: bool = False
    script: str | None = None  # the first word that is neither an option nor an override
    log_dir: str | None = None  # torchrun's --log-dir (PET_LOG_DIR): its per-rank log files
    nproc_per_node: str | None = None  # --nproc-per-node (PET_NPROC_PER_NODE), as written

    def check_nproc(self) -> None:
        """A count of ranks below 1 is refused before torch is imported (``auto``,
        ``cpu``, ``gpu``, ``xpu`` and the rest are torch's to read)."""
        value = (self.nproc_per_node or "").strip()
        try:
            count = int(value)
        except ValueError:
            return
        if count < 1:
            raise ValueError(f"--nproc-per-node: must be >= 1, got {count}")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def pre_pass(argv: list[str]) -> PrePass:
    """Read ``argv`` (the words after ``run``, NVRx flags already turned into ``--set``)
    for rankguard's own settings. ``PET_CONFIG`` and ``PET_LOG_DIR`` stand for the flags
    when these are absent, as torch's ``PET_<FLAG>`` variables do."""
    out = PrePass()
    log_dir = os.environ.get("PET_LOG_DIR") or None
    out.nproc_per_node = os.environ.get("PET_NPROC_PER_NODE") or None
    out.config = os.environ.get("PET_CONFIG") or None
    out.no_python = _env_flag("PET_NO_PYTHON")
    sets: list[str] = []
    bare: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("-") and len(word) > 1 and word != "--":
            name, eq, value = word.partition("=")
            if not eq and _takes_value(name):
                value = argv[i + 1] if i + 1 < len(argv) else ""
                i += 1
            if name == "--config":
                out.config = value
            elif name == "--set":
                sets.append(value)
            elif name in _LOG_DIR_FLAGS:
                log_dir = value
            elif name in _NPROC_FLAGS:
                out.nproc_per_node = value
            elif name in _NO_PYTHON_FLAGS:
                out.no_python = True
        elif is_override(word):
            bare.append(word)
        else:
            out.has_script = word != "--"
            out.script = word if out.has_script else None
            break
        i += 1
    out.log_dir = log_dir
    out.overrides = ([f"log_dir={log_dir}"] if log_dir else []) + sets + bare
    return out


def _ft_key(flag: str, keys: tuple[str, ...]) -> str:
    """The fault_tolerance key of an NVRx ``--ft-<key>`` flag, or ValueError naming it."""
    key = flag[len("--ft-") :].replace("-", "_").removeprefix("param_")
    if key in keys:
        return key
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f"; did you mean --ft-{close[0]}?" if close else ""
    raise ValueError(
        f"{flag}: not a fault tolerance setting{hint} (known: "
        + ", ".join(f"--ft-{k}" for k in keys)
        + ")"
    )


def nvrx_flags(argv: list[str], keys: tuple[str, ...], switches: set[str]) -> list[str]:
    """NVRx ``ft_launcher`` flags anywhere before the script, ``--ft-<key>=<value>`` or
    ``--ft-<key> <value>`` (e.g. ``--ft-rank_section_timeouts=setup:600,step:180``), read
    as ``--set fault_tolerance.<key>=<value>`` ahead of the other words (so they never
    split bare overrides from the script). ``argv[0]`` is the command (``run``); words
    from the script on are its own. ``keys``: the fault tolerance keys, ``switches``
    those that are booleans off by default. A misspelt flag is a ValueError naming it.

    ``ft_launcher``'s own flags (``--ft-param-*``, ``--ft-cfg-path``, ``--term-timeout``,
    ...: :mod:`rankguard.ft.launcher_flags`) take NVRx's meaning; those without effect
    under rankguard are one line each on stderr."""
    from rankguard.ft import launcher_flags  # torch-free until such a flag is given

    head: list[str] = []
    sets: list[str] = []
    launcher: dict[str, str | None] = {}  # ft_launcher's own flags (NVRx's meaning)
    flags = None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            break
        option, eq, given = word.partition("=")
        nvrx_flag = None
        if word.startswith("--") and launcher_flags.flag_for(option) is not None:
            if flags is None:
                flags, _ = launcher_flags.launcher_flags()
            nvrx_flag = launcher_flags.flag_for(option, flags)
        if nvrx_flag is not None:
            if nvrx_flag.takes_value and not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{option}: expected a value ({option}=VALUE)")
                i += 1
                given = argv[i]
            launcher[option] = given if nvrx_flag.takes_value else None
        elif word.startswith("--ft-"):
            flag, sep, value = word.partition("=")
            key = _ft_key(flag, keys)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if (
                not sep
                and key in switches
                and (nxt is None or nxt.lower() not in ("true", "false", "1", "0"))
            ):
                value = "true"  # a switch given alone: --ft-enable_ft_package
            elif not sep:
                if nxt is None:
                    raise ValueError(f"{flag}: expected a value ({flag}=VALUE or {flag} VALUE)")
                i += 1
                value = argv[i]
            sets += ["--set", f"fault_tolerance.{key}={value}"]
        elif word.startswith("-") and len(word) > 1:
            head.append(word)
            if "=" not in word and _takes_value(word) and i + 1 < len(argv):
                i += 1
                head.append(argv[i])
        elif is_override(word):
            head.append(word)
        else:
            break  # the script (or the module after -m)
        i += 1
    if launcher:
        assert flags is not None
        translated = launcher_flags.translate(launcher, flags)
        for line in translated.warnings:
            print(f"rankguard run: {line}", file=sys.stderr)
        sets = [w for s in translated.sets for w in ("--set", s)] + sets  # own --ft-* win
    return [*argv[:1], *sets, *head, *argv[i:]]
