"""``rankguard demo``: the demo job under the real launcher, with short timeouts so a
fault is visible within seconds."""

from __future__ import annotations

import argparse

from rankguard.config import ConfigError, load_config
from rankguard.launcher.options import LaunchOptions

__all__ = ["DEMO_OVERRIDES", "add_parser", "run"]

# Short timeouts for a demo: a stall or SIGSTOP is reported within seconds.
DEMO_OVERRIDES = [
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.initial_process_timeout_s=30",
    "heartbeat.process_timeout_s=3",
    "heartbeat.initial_progress_timeout_s=60",
    "heartbeat.progress_timeout_s=4",
    "heartbeat.checkpoint_timeout_s=20",
]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the demo training job (2 CPU ranks) under rankguard",
        description="A small GPT on synthetic tokens under `rankguard run`, with a live "
        "status line. Inject a fault to see the finding it produces.",
    )
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="default 40 (100 with a fault)")
    p.add_argument(
        "--fault", choices=["none", "stall", "stop", "crash", "slow", "preempt"], default="none"
    )
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--fault-duration", type=float, default=8.0)
    p.add_argument("--slowdown", type=float, default=1.5)
    p.add_argument(
        "--preload",
        default="",
        metavar="MODULES",
        help="as `rankguard run --preload` (e.g. torch): ranks forked from a fork server",
    )
    p.add_argument("--log-dir", default="rankguard_logs")
    p.add_argument("--config", default=None, help="YAML config (demo defaults still apply)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # --fault preempt: the exit handler on (the user's overrides still win)
    preempt = ["preemption.enable_exit_handler=true"] if args.fault == "preempt" else []
    try:
        cfg = load_config(
            args.config, [f"log_dir={args.log_dir}", *DEMO_OVERRIDES, *preempt, *args.overrides]
        )
    except ConfigError as exc:
        print(f"rankguard demo: config error: {exc}")
        return 2
    steps = args.steps or (40 if args.fault == "none" else 100)
    target_args = [
        "--steps",
        str(steps),
        "--fault",
        args.fault,
        "--fault-rank",
        str(args.fault_rank),
        "--fault-step",
        str(args.fault_step),
        "--fault-duration",
        str(args.fault_duration),
        "--slowdown",
        str(args.slowdown),
    ]
    if args.fault != "none" and not 0 <= args.fault_rank < args.nproc_per_node:
        print(f"rankguard demo: --fault-rank must be in [0, {args.nproc_per_node})")
        return 2
    from rankguard.launcher.run import launch  # imports torch: not for `--help`

    opts = LaunchOptions(
        target="rankguard.demo.train",
        target_args=target_args,
        module=True,
        nproc_per_node=args.nproc_per_node,
        standalone=True,
        live_status=True,
        preload=tuple(m.strip() for m in args.preload.split(",") if m.strip()),
    )
    return launch(opts, cfg)
