"""``rankguard`` command line: run, demo, status."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import sys

from rankguard import __version__
from rankguard.cli import status
from rankguard.config import ConfigError, load_config
from rankguard.demo import cli as demo_cli
from rankguard.ft import launcher_flags
from rankguard.ft.config import FaultToleranceConfig
from rankguard.launcher.options import add_launch_arguments, is_override, options_from_args
from rankguard.report import cli as report_cli
from rankguard.slurm import cli as slurm_cli

__all__ = ["build_parser", "main"]


def _add_run(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="launch a distributed training script under rankguard (torchrun-compatible)",
        description="Launch SCRIPT on this node with torch.distributed.elastic and "
        "rankguard's monitoring. Config: --config FILE plus KEY=VALUE overrides, given "
        "with --set or as bare words before SCRIPT.",
    )
    add_launch_arguments(p)
    p.add_argument("--live", action="store_true", help="show a live status line (node 0)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rankguard.launcher.run import launch  # imports torch: not for the light commands

    try:
        opts, overrides = options_from_args(args)
        opts.live_status = args.live
        cfg = load_config(args.config, overrides)
    except (ConfigError, ValueError) as exc:
        print(f"rankguard run: {exc}", file=sys.stderr)
        return 2
    return launch(opts, cfg)


def build_parser() -> argparse.ArgumentParser:
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
    report_cli.add_parser(sub)
    slurm_cli.add_parser(sub)
    return parser


def _value_options() -> set[str]:
    """``rankguard run``'s option strings that take a value (their next word is not the
    script)."""
    p = argparse.ArgumentParser(add_help=False)
    add_launch_arguments(p)
    return {o for a in p._actions if a.option_strings and a.nargs != 0 for o in a.option_strings}


_FT_KEYS = tuple(f.name for f in dataclasses.fields(FaultToleranceConfig))
_FT_SWITCHES = {f.name for f in dataclasses.fields(FaultToleranceConfig) if f.default is False}


def _ft_key(flag: str) -> str:
    """The fault_tolerance key of an NVRx ``--ft-<key>`` flag, or ValueError naming it."""
    key = flag[len("--ft-") :].replace("-", "_").removeprefix("param_")
    if key in _FT_KEYS:
        return key
    close = difflib.get_close_matches(key, _FT_KEYS, n=1)
    hint = f"; did you mean --ft-{close[0]}?" if close else ""
    raise ValueError(
        f"{flag}: not a fault tolerance setting{hint} (known: "
        + ", ".join(f"--ft-{k}" for k in _FT_KEYS)
        + ")"
    )


def _nvrx_flags(argv: list[str]) -> list[str]:
    """NVRx ``ft_launcher`` flags anywhere before the script, ``--ft-<key>=<value>`` or
    ``--ft-<key> <value>`` (e.g. ``--ft-rank_section_timeouts=setup:600,step:180``), read
    as ``--set fault_tolerance.<key>=<value>`` ahead of the other words (so they never
    split bare overrides from the script). Words from the script on are its own. A
    misspelt flag is a ValueError naming it."""
    takes_value = _value_options()
    head: list[str] = []
    sets: list[str] = []
    launcher: dict[str, str | None] = {}  # ft_launcher's own flags (NVRx's meaning)
    flags = None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            break
        option, sep, value = word.partition("=")
        nvrx_flag = None
        if word.startswith("--") and launcher_flags.flag_for(option) is not None:
            if flags is None:
                flags, _ = launcher_flags.launcher_flags()
            nvrx_flag = launcher_flags.flag_for(option, flags)
        if nvrx_flag is not None:
            if nvrx_flag.takes_value and not sep:
                if i + 1 >= len(argv):
                    raise ValueError(f"{option}: expected a value ({option}=VALUE)")
                i += 1
                value = argv[i]
            launcher[option] = value if nvrx_flag.takes_value else None
        elif word.startswith("--ft-"):
            flag, sep, value = word.partition("=")
            key = _ft_key(flag)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if (
                not sep
                and key in _FT_SWITCHES
                and (nxt is None or nxt.lower() not in ("true", "false", "1", "0"))
            ):
                value = "true"  # a switch given alone: --ft-enable_ft_package
            elif not sep:
                if nxt is None:
                    raise ValueError(f"{flag}: expected a value ({flag}=VALUE or {flag} VALUE)")
                i += 1
                value = argv[i]
            sets += ["--set", f"fault_tolerance.{key}={value}"]
        elif word.startswith("-"):
            head.append(word)
            if "=" not in word and word in takes_value and i + 1 < len(argv):
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        try:
            argv = _nvrx_flags(argv)
        except ValueError as exc:
            print(f"rankguard run: {exc}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="[rankguard %(levelname)s %(name)s] %(message)s",
    )
    logging.getLogger("rankguard").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
