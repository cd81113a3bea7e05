"""``rankguard`` command line: run, demo, status, logs, goodput, report, slurm."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankguard import __version__
from rankguard.config import ConfigError, RankguardConfig, load_config
from rankguard.ft.config import FaultToleranceConfig
from rankguard.launcher.exitcodes import EXIT_USAGE
from rankguard.util.gcfreeze import pause_collection, resume_collection

__all__ = ["build_parser", "main", "run_main"]


def _add_run(subparsers: argparse._SubParsersAction) -> None:
    # Listed for ``rankguard --help``; ``rankguard run ...`` is parsed by torchrun's own
    # parser (:func:`run_main`), which imports torch.
    subparsers.add_parser(
        "run",
        help="launch a distributed training script under rankguard (torchrun's flags)",
        add_help=False,
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _check_dirs(cfg: RankguardConfig, torch_log_dir: str | None) -> None:
    """Every directory the launch creates can be created: rankguard's ``log_dir`` (the
    run files, and torch elastic's per-rank logs under it), torchrun's ``--log-dir``
    when the configuration roots rankguard's files elsewhere, and the learned timeouts'
    ``fault_tolerance.state_dir``."""
    from rankguard.launcher.rundir import check_creatable

    log_dir = cfg.log_dir
    check_creatable(log_dir, "log_dir")
    if torch_log_dir and Path(torch_log_dir).absolute() != Path(log_dir).absolute():
        check_creatable(torch_log_dir, "--log-dir")
    ft = cfg.fault_tolerance
    if ft.calc_ft_timeouts and ft.state_dir:
        check_creatable(ft.state_dir, "fault_tolerance.state_dir")


def _script_missing(opts: Any) -> str | None:
    """Why the training script cannot start (None: it can, as far as can be told)."""
    from rankguard.launcher.options import ENTRY_NO_PYTHON

    if opts.module:
        return None
    target = opts.target
    if opts.entry == ENTRY_NO_PYTHON:
        if os.sep not in target and shutil.which(target):
            return None
        if os.path.isfile(target) and os.access(target, os.X_OK):
            return None
        return f"--no-python: {target}: no such executable"
    if not os.path.isfile(target):
        return f"training script not found: {target}"
    return None


def run_main(argv: list[str]) -> int:
    """``rankguard run ARGV``. rankguard's own settings are read and checked first,
    without torch (:mod:`rankguard.launcher.argv`): a configuration error is said in one
    line at once. Then torchrun's parser reads the whole line."""
    from rankguard.launcher.argv import nvrx_flags, pre_pass

    try:
        argv = nvrx_flags(["run", *argv], _FT_KEYS, _FT_SWITCHES)[1:]
        pre = pre_pass(argv)
        defaults = {"heartbeat.enabled": not pre.no_python}
        cfg = load_config(pre.config, pre.overrides, defaults=defaults)
        pre.check_nproc()
        _check_dirs(cfg, pre.log_dir)
        if not pre.has_script and not {"-h", "--help"} & set(argv):
            raise ValueError("no training script given")
        if pre.script and pre.script.endswith(".py") and not os.path.isfile(pre.script):
            raise ValueError(f"training script not found: {pre.script}")
    except (ConfigError, ValueError) as exc:
        print(f"rankguard run: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    # torch's import ahead: collected once when the launch starts (freeze_startup)
    pause_collection()
    try:
        return _parse_and_launch(argv, pre, cfg, defaults)
    finally:
        resume_collection()  # an error line before the launch: collection as it was


def _parse_and_launch(
    argv: list[str], pre: Any, cfg: RankguardConfig, defaults: Mapping[str, object]
) -> int:
    from rankguard.launcher.options import parse_run_args  # imports torch
    from rankguard.launcher.run import launch
    from rankguard.schema import layout

    try:
        opts, overrides = parse_run_args(
            argv, default_log_dir=str(layout.elastic_log_dir(cfg.log_dir))
        )
        if overrides != pre.overrides:  # the full parse split the line otherwise
            cfg = load_config(pre.config, overrides, defaults=defaults)
        missing = _script_missing(opts)
        if missing:
            raise ValueError(missing)
    except (ConfigError, ValueError) as exc:
        print(f"rankguard run: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    if pre.no_python and not cfg.heartbeat.enabled:
        print(
            "[rankguard] --no-python: the ranks start without rankguard's bootstrap: "
            "heartbeat monitoring is off (heartbeat.enabled=true if the program calls "
            "rankguard.init())",
            file=sys.stderr,
        )
    return launch(opts, cfg)


def build_parser() -> argparse.ArgumentParser:
    # the other commands' modules only here: ``rankguard run`` checks its config first
    from rankguard.cli import goodput, logs, status
    from rankguard.demo import cli as demo_cli
    from rankguard.report import cli as report_cli
    from rankguard.slurm import cli as slurm_cli

    parser = argparse.ArgumentParser(
        prog="rankguard",
        description="Keeps distributed PyTorch training alive and says what is wrong.",
    )
    parser.add_argument("--version", action="version", version=f"rankguard {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    demo_cli.add_parser(sub)
    status.add_parser(sub)
    logs.add_parser(sub)
    goodput.add_parser(sub)
    report_cli.add_parser(sub)
    slurm_cli.add_parser(sub)
    return parser


_FT_KEYS = tuple(f.name for f in dataclasses.fields(FaultToleranceConfig))
_FT_SWITCHES = {f.name for f in dataclasses.fields(FaultToleranceConfig) if f.default is False}


def _nvrx_flags(argv: list[str]) -> list[str]:
    """NVRx ``ft_launcher`` flags as ``--set fault_tolerance.<key>=<value>``
    (:func:`rankguard.launcher.argv.nvrx_flags`)."""
    from rankguard.launcher.argv import nvrx_flags

    return nvrx_flags(argv, _FT_KEYS, _FT_SWITCHES)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = False
    while argv[:1] and argv[0] in ("-v", "--verbose"):
        verbose, argv = True, argv[1:]
    if argv[:1] == ["run"]:
        _logging(verbose)
        return run_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    _logging(args.verbose or verbose)
    return int(args.func(args) or 0)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="[rankguard %(levelname)s %(name)s] %(message)s",
    )
    logging.getLogger("rankguard").setLevel(logging.DEBUG if verbose else logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
