"""``rankguard demo``: the demo job under the real launcher, with short timeouts so a
fault is visible within seconds."""

from __future__ import annotations

import argparse
import os
import tempfile

from rankguard.config import ConfigError, load_config
from rankguard.launcher.options import LaunchOptions
from rankguard.util.gcfreeze import pause_collection, resume_collection

__all__ = ["DEMO_OVERRIDES", "add_parser", "run"]

NAN_FAULTS = ("nan", "nan-persistent", "nan-bad-gpu")  # as rankguard.demo.train (torch-free)

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
        "--fault",
        choices=["none", "stall", "stop", "crash", "slow", "preempt", *NAN_FAULTS],
        default="none",
        help="preempt: SIGTERM to the launcher at --fault-step (a graceful preemption); "
        "nan*: the rerun state machine's paths (transient; exit 16 then a data "
        "problem; exit 16 then exit 17)",
    )
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--fault-duration", type=float, default=8.0)
    p.add_argument("--slowdown", type=float, default=1.5)
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps")
    p.add_argument("--eval-seconds", type=float, default=0.0, help="extra time per evaluation")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every N steps")
    p.add_argument("--save-seconds", type=float, default=0.0, help="extra time per save")
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
    rerun = args.fault in NAN_FAULTS
    extra = ["rerun_state_machine.rerun_mode=validate_results"] if rerun else []
    # --fault preempt: the exit handler on (the user's overrides still win)
    if args.fault == "preempt":
        extra.append("preemption.enable_exit_handler=true")
    try:
        cfg = load_config(
            args.config, [f"log_dir={args.log_dir}", *DEMO_OVERRIDES, *extra, *args.overrides]
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
        "--eval-every",
        str(args.eval_every),
        "--eval-seconds",
        str(args.eval_seconds),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--save-seconds",
        str(args.save_seconds),
    ]
    if args.fault != "none" and not 0 <= args.fault_rank < args.nproc_per_node:
        print(f"rankguard demo: --fault-rank must be in [0, {args.nproc_per_node})")
        return 2
    if rerun:  # exit 16 resumes from this checkpoint (an in-job restart)
        os.makedirs(args.log_dir, exist_ok=True)
        ckpt = tempfile.mkdtemp(prefix="demo_checkpoints_", dir=args.log_dir)
        target_args += ["--checkpoint-dir", ckpt]
    pause_collection()  # torch's import ahead: collected once when the launch starts
    try:
        from rankguard.launcher.run import launch  # imports torch: not for `--help`

        opts = LaunchOptions(
            target="rankguard.demo.train",
            target_args=target_args,
            module=True,
            nproc_per_node=args.nproc_per_node,
            standalone=True,
            live_status=True,
            max_restarts=1 if rerun else 0,
            preload=tuple(m.strip() for m in args.preload.split(",") if m.strip()),
        )
        return launch(opts, cfg)
    finally:
        resume_collection()  # an error before the launch: collection as it was
