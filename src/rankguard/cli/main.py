"""``rankguard`` command line: run, demo, status."""

from __future__ import annotations

import argparse
import logging
import sys

from rankguard import __version__
from rankguard.cli import status
from rankguard.config import ConfigError, load_config
from rankguard.demo import cli as demo_cli
from rankguard.launcher.options import add_launch_arguments, options_from_args
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


def _nvrx_flags(argv: list[str]) -> list[str]:
    """NVRx ``ft_launcher`` flags before the script, ``--ft-<key>=<value>`` (e.g.
    ``--ft-rank_section_timeouts=setup:600,step:180``), read as
    ``--set fault_tolerance.<key>=<value>``."""
    out: list[str] = []
    for i, word in enumerate(argv):
        if word == "-m" or word.endswith(".py") or word == "--":
            return out + argv[i:]
        if word.startswith("--ft-") and "=" in word:
            key, value = word[len("--ft-") :].split("=", 1)
            out += ["--set", f"fault_tolerance.{key.replace('-', '_')}={value}"]
        else:
            out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        argv = _nvrx_flags(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="[rankguard %(levelname)s %(name)s] %(message)s",
    )
    logging.getLogger("rankguard").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
