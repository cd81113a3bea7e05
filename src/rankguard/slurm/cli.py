"""``rankguard slurm``: job-level retries around ``rankguard run``.

``rankguard slurm sbatch [options] SCRIPT [ARGS]``
    print (or write with ``-o FILE``) an sbatch script that runs ``rankguard run`` on every
    node and requeues the job on a retryable exit code; ``--submit`` also runs
    ``sbatch FILE`` and prints the job id. Exit codes: 0 done, 1 sbatch failed, 2 bad
    options or config, or the file cannot be written. The config is read here too, to
    check it and to take ``fault_tolerance.num_job_retries_on_failure`` from it.

``rankguard slurm retry --max-retries N -- COMMAND...``
    for allocations without requeue: run COMMAND up to 1 + N times while it exits with a
    retryable code; exits with the last attempt's code.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from rankguard.config import RankguardConfig, load_config
from rankguard.launcher.exitcodes import EXIT_FAILED, EXIT_USAGE, RETRYABLE
from rankguard.launcher.options import split_overrides
from rankguard.slurm.retry import run_with_retries
from rankguard.slurm.sbatch import SbatchSpec, parse_job_id, preempt_signal, render_sbatch
from rankguard.util.fs import atomic_write_text

__all__ = ["SBATCH_TIMEOUT_S", "add_parser", "inactive_settings", "run", "spec_from_args"]

SBATCH_TIMEOUT_S = 60.0
"""How long ``--submit`` waits for ``sbatch`` (it only talks to the controller)."""

_RETRYABLE_TEXT = ", ".join(str(c) for c in sorted(RETRYABLE))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "slurm",
        help="Slurm: sbatch script with job requeue, or a retry wrapper",
        description="Job-level retries: after `rankguard run` has spent its in-job restarts "
        f"it exits with a code; {_RETRYABLE_TEXT} are retryable (see docs/slurm.md).",
    )
    sub = p.add_subparsers(dest="slurm_command", required=True)
    _add_sbatch(sub)
    _add_retry(sub)
    p.set_defaults(func=run)


def _add_sbatch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sbatch",
        help="print, write or submit an sbatch script running `rankguard run` on every node",
        description="Render an sbatch script: one `rankguard run` per node, the first node as "
        "rendezvous host, $SLURM_JOB_ID as run id, and `scontrol requeue` after a retryable "
        "exit code while SLURM_RESTART_COUNT < --job-retries. Bare KEY=VALUE words before "
        "SCRIPT are config overrides for `rankguard run`.",
    )
    g = p.add_argument_group("allocation (#SBATCH)")
    g.add_argument(
        "-J", "--job-name", default=None, metavar="NAME", help="default: the script's name"
    )
    g.add_argument("-N", "--nodes", type=int, default=1, metavar="N")
    g.add_argument(
        "--gpus-per-node", type=int, default=8, metavar="G", help="default 8; 0: no GPU request"
    )
    g.add_argument(
        "-t", "--time", required=True, dest="time_limit", metavar="TIME", help="e.g. 04:00:00"
    )
    g.add_argument("-p", "--partition", default=None)
    g.add_argument("-A", "--account", default=None)
    g.add_argument(
        "--job-output",
        default="slurm-%x-%j.out",
        metavar="PATTERN",
        help="--output pattern (appended per retry)",
    )
    g.add_argument(
        "--signal",
        default=None,
        metavar="SIG@S",
        help="e.g. TERM@60: SIGTERM 60 s before the limit",
    )
    g.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        dest="extra_sbatch",
        help="extra directive, repeatable: --sbatch=--exclusive",
    )
    f = p.add_argument_group("fault tolerance")
    f.add_argument(
        "--job-retries",
        "--num-job-retries-on-failure",
        type=int,
        default=None,
        dest="num_job_retries_on_failure",
        metavar="N",
        help="requeue the job at most N times after a retryable exit (default: "
        "fault_tolerance.num_job_retries_on_failure, 0)",
    )
    f.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="N",
        help="rankguard run --max-restarts: restarts inside the job (default: "
        "fault_tolerance.num_in_job_restarts, 0)",
    )
    r = p.add_argument_group("rankguard run")
    r.add_argument("--nproc-per-node", type=int, default=None, metavar="N", help="default: G")
    r.add_argument("--rdzv-port", type=int, default=29500, metavar="PORT")
    r.add_argument("--log-dir", default=None, metavar="DIR", help="default: the config's")
    r.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML config file (read here to check it, and on the nodes)",
    )
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    r.add_argument(
        "--rankguard-arg",
        action="append",
        default=[],
        metavar="ARG",
        dest="rankguard_args",
        help="any other `rankguard run` argument, repeatable: --rankguard-arg=--live",
    )
    r.add_argument(
        "--rankguard-bin", default="rankguard", metavar="PATH", help="rankguard on the nodes"
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "-o", "--output", type=Path, default=None, metavar="FILE", help="write the script here"
    )
    o.add_argument(
        "--submit",
        action="store_true",
        help="run `sbatch FILE` and print the job id (FILE: -o, or "
        "<log_dir>/slurm/<job-name>.sbatch)",
    )
    p.add_argument("target", metavar="SCRIPT", help="training script, then its arguments")
    p.add_argument("target_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _add_retry(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "retry",
        help="run a command again while it exits with a retryable code (no requeue needed)",
        description="Run COMMAND up to 1 + --max-retries times while it exits with a "
        f"retryable code ({_RETRYABLE_TEXT}); print each attempt and its exit code; exit "
        "with the last code. SIGTERM/SIGINT/SIGHUP go to the running attempt and stop the "
        "retries.",
    )
    p.add_argument("--max-retries", type=int, required=True, metavar="N")
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS", help="between tries")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def spec_from_args(args: argparse.Namespace) -> tuple[SbatchSpec, RankguardConfig]:
    """The :class:`SbatchSpec` described by ``rankguard slurm sbatch``'s arguments, and the
    config ``rankguard run`` will load from them (``--config``, ``--set``, ``KEY=VALUE``).

    The config is read here so that a bad one fails now rather than after the queue, and
    so that ``fault_tolerance.num_job_retries_on_failure`` applies when ``--job-retries``
    is not given. A flag and a config value that disagree are an error, as in
    ``rankguard run``. Raises ``ValueError`` (``ConfigError``) naming the setting.
    """
    overrides, script, script_args = split_overrides(args.target, list(args.target_args))
    overrides = [*args.overrides, *overrides]
    log_override = [f"log_dir={args.log_dir}"] if args.log_dir else []
    cfg = load_config(args.config, [*log_override, *overrides])
    ft = cfg.fault_tolerance
    retries = args.num_job_retries_on_failure
    if retries is None:
        retries = ft.num_job_retries_on_failure
    elif ft.num_job_retries_on_failure and retries != ft.num_job_retries_on_failure:
        raise ValueError(
            f"--job-retries {retries} and fault_tolerance.num_job_retries_on_failure="
            f"{ft.num_job_retries_on_failure} disagree: give one of them"
        )
    if args.max_restarts and ft.num_in_job_restarts and args.max_restarts != ft.num_in_job_restarts:
        raise ValueError(
            f"--max-restarts {args.max_restarts} and fault_tolerance.num_in_job_restarts="
            f"{ft.num_in_job_restarts} disagree: give one of them"
        )
    rankguard_args: list[str] = []
    if args.config:
        rankguard_args += ["--config", args.config]
    for item in overrides:
        rankguard_args += ["--set", item]
    rankguard_args += args.rankguard_args
    nproc = args.nproc_per_node
    if nproc is None:
        nproc = args.gpus_per_node if args.gpus_per_node > 0 else 1
    spec = SbatchSpec(
        job_name=args.job_name or Path(script).stem or "rankguard",
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        nproc_per_node=nproc,
        time_limit=args.time_limit,
        partition=args.partition,
        account=args.account,
        output=args.job_output,
        num_job_retries_on_failure=retries,
        max_restarts=args.max_restarts,
        rdzv_port=args.rdzv_port,
        log_dir=args.log_dir,
        signal=args.signal or _preempt_signal(cfg),
        extra_sbatch=list(args.extra_sbatch),
        rankguard_args=rankguard_args,
        rankguard_bin=args.rankguard_bin,
        script=script,
        script_args=script_args,
    )
    return spec, cfg


def _preempt_signal(cfg: RankguardConfig) -> str | None:
    """With ``preemption.enable_exit_handler`` and no ``--signal``: warn that many seconds
    before the time limit (``B:TERM@<preempt_time + margin>``)."""
    pre = cfg.preemption
    if not pre.enable_exit_handler:
        return None
    return preempt_signal(pre.preempt_time, str(pre.exit_signal))


def inactive_settings(spec: SbatchSpec, cfg: RankguardConfig) -> list[str]:
    """Warnings about job retries that are configured but cannot happen."""
    if spec.num_job_retries_on_failure == 0 or cfg.fault_tolerance.enable_ft_package:
        return []
    what = (
        "only a refusal by the GPU health check (exit 3) is retried"
        if cfg.enable_gpu_health_check
        else "the job will never be requeued"
    )
    return [
        f"num_job_retries_on_failure={spec.num_job_retries_on_failure} but "
        "fault_tolerance.enable_ft_package=false: rankguard run then exits 1 (not retryable) "
        f"after a hang or crash, so {what}. Set fault_tolerance.enable_ft_package=true."
    ]


def _default_script_path(spec: SbatchSpec, log_dir: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", spec.job_name)
    return Path(log_dir) / "slurm" / f"{name}.sbatch"


def _sbatch(args: argparse.Namespace) -> int:
    try:
        spec, cfg = spec_from_args(args)
    except ValueError as exc:
        print(f"rankguard slurm sbatch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in inactive_settings(spec, cfg):
        print(f"rankguard slurm sbatch: WARNING: {warning}", file=sys.stderr)
    text = render_sbatch(spec)
    path: Path | None = args.output
    if path is None and args.submit:
        path = _default_script_path(spec, cfg.log_dir)
    if path is None:
        sys.stdout.write(text)
        return 0
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        print(f"rankguard slurm sbatch: cannot write {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"rankguard slurm sbatch: wrote {path}", file=sys.stderr)
    if not args.submit:
        return 0
    return _submit(path)


def _submit(path: Path) -> int:
    try:
        proc = subprocess.run(
            ["sbatch", str(path)],
            capture_output=True,
            text=True,
            timeout=SBATCH_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        print("rankguard slurm sbatch: sbatch not found on PATH", file=sys.stderr)
        return EXIT_FAILED
    except subprocess.TimeoutExpired:
        print(
            f"rankguard slurm sbatch: sbatch {path} gave no answer in {SBATCH_TIMEOUT_S:g} s",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    job_id = parse_job_id(proc.stdout)
    if proc.returncode != 0 or job_id is None:
        print(
            f"rankguard slurm sbatch: sbatch {path} failed (exit {proc.returncode}): "
            f"{proc.stdout.strip() or 'no job id'}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(job_id)
    return 0


def _retry(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("rankguard slurm retry: no command given after --", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run_with_retries(command, max_retries=args.max_retries, delay_s=args.delay)
    except ValueError as exc:
        print(f"rankguard slurm retry: {exc}", file=sys.stderr)
        return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    if args.slurm_command == "sbatch":
        return _sbatch(args)
    if args.slurm_command == "retry":
        return _retry(args)
    raise AssertionError(f"unknown slurm command {args.slurm_command!r}")
