"""Render an sbatch script that runs ``rankguard run`` on every node and requeues on failure.

The script asks Slurm for one task per node (one ``rankguard run`` launcher per node,
which starts ``nproc_per_node`` ranks), takes the first node of the allocation as the
rendezvous host and ``$SLURM_JOB_ID`` as the run id, so every node and every retry of the
job name the same run. Node ranks come from ``$SLURM_NODEID``, expanded inside each task.

``srun`` reports the highest exit code of the tasks. When that code is retryable
(:data:`rankguard.launcher.exitcodes.RETRYABLE`) and ``$SLURM_RESTART_COUNT`` (0 on the
first run) is below ``num_job_retries_on_failure``, the script runs
``scontrol requeue $SLURM_JOB_ID``: Slurm puts the same job id back in the queue, and the
next run appends to the same output file (``--open-mode=append``). The decision is the
shell twin of :func:`rankguard.slurm.retry.decide`; each one is logged with a UTC time.
On exit 17 (the rerun state machine: the first run's GPU was faulty) the job is
submitted again without the hosts rank 0 named in ``$RANKGUARD_EXCLUDE_FILE``
(``sbatch --exclude``, after this job: ``--dependency=afterany``), cumulatively over the
job's retries; on exit 15 (bad-node exclusion) without the hosts each excluded node
named in ``$RANKGUARD_EXCLUDE_FILE.node.<pid>``, the same way. Not a requeue: Slurm
takes no ``ExcNodeList`` for a running job ("Job is no longer pending execution"), and
its requeue ends the batch script at once, before a later ``scontrol update`` could
run. The new job carries the first job's id as its run id (``RANKGUARD_SLURM_RUN_ID``:
the same run directory and rendezvous id) and the retries spent
(``RANKGUARD_SLURM_RETRIES``, added to its own ``SLURM_RESTART_COUNT``).

Every user value is shell-quoted; ``#SBATCH`` values too (sbatch strips quotes the same
way, and an unquoted ``#`` would start a comment there).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from rankguard import __version__
from rankguard.launcher.exitcodes import EXIT_PREEMPTED, RETRYABLE

__all__ = ["SIGNAL_MARGIN_S", "SbatchSpec", "parse_job_id", "preempt_signal", "render_sbatch"]

SIGNAL_MARGIN_S = 30
"""Seconds added to ``preempt_time`` in ``--signal``: the launcher's exit, the batch
shell's requeue, and Slurm's own resolution (it may signal up to a minute early, never
late)."""


def preempt_signal(preempt_time: float, exit_signal: str = "SIGTERM") -> str:
    """``--signal`` for preemption: ``B:TERM@<preempt_time + margin>``. ``B:`` signals the
    batch shell only, which stays to decide on the exit code; the script passes the
    signal on to the job's steps (``scancel --signal``: every node's ``rankguard run`` and
    its ranks), never to ``srun``, which would end its step on SIGTERM."""
    return f"B:{exit_signal.removeprefix('SIG')}@{int(preempt_time + 0.999) + SIGNAL_MARGIN_S}"


# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED/INFINITE.
_TIME_RE = re.compile(
    r"^(?:\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+|UNLIMITED|INFINITE)$"
)
# --signal=[{R|B}:]<sig_num|sig_name>[@sig_time]
_SIGNAL_RE = re.compile(r"^(?:[RB]{1,2}:)?(?:SIG)?[A-Za-z0-9]+(?:@\d+)?$")
_JOB_ID_RE = re.compile(r"Submitted batch job (\d+(?:_\d+)?)")


def _one_line(name: str, value: str) -> None:
    if not value or not value.strip():
        raise ValueError(f"{name}: must not be empty")
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{name}: must be one line, got {value!r}")


@dataclass(kw_only=True, slots=True)
class SbatchSpec:
    """What to submit. Durations and names use Slurm's own formats."""

    job_name: str
    """``--job-name``."""
    nodes: int
    """``--nodes``: one ``rankguard run`` per node."""
    time_limit: str
    """``--time``, in Slurm's format (``MM``, ``HH:MM:SS``, ``D-HH:MM`` ...)."""
    script: str
    """The training script given to ``rankguard run``."""
    script_args: list[str] = field(default_factory=list)
    """Arguments of the training script."""
    nproc_per_node: int = 8
    """Ranks per node (``rankguard run --nproc-per-node``)."""
    gpus_per_node: int = 8
    """``--gpus-per-node``; 0 requests no GPU (the directive is left out)."""
    ntasks_per_node: int = 1
    """Must be 1: the launcher on each node starts that node's ranks."""
    partition: str | None = None
    """``--partition``, left out when None."""
    account: str | None = None
    """``--account``, left out when None."""
    output: str = "slurm-%x-%j.out"
    """``--output`` pattern; every retry appends to it."""
    num_job_retries_on_failure: int = 0
    """How many times the job is requeued after a retryable exit of ``rankguard run``."""
    max_restarts: int | None = None
    """``rankguard run --max-restarts`` (restarts inside the job); None: not passed."""
    rdzv_port: int = 29500
    """Rendezvous port on the first node."""
    log_dir: str | None = None
    """``rankguard run --log-dir``; None: not passed (the config's ``log_dir``)."""
    signal: str | None = None
    """``--signal``, e.g. ``TERM@60``: SIGTERM to the launchers 60 s before the time limit."""
    extra_sbatch: list[str] = field(default_factory=list)
    """More directives, with or without the ``#SBATCH`` prefix (``--exclusive``)."""
    rankguard_args: list[str] = field(default_factory=list)
    """Given to ``rankguard run`` before the script (``--config``, ``key=value``)."""
    rankguard_bin: str = "rankguard"
    """The ``rankguard`` executable on the compute nodes."""

    def __post_init__(self) -> None:
        _one_line("job_name", self.job_name)
        _one_line("script", self.script)
        _one_line("output", self.output)
        _one_line("rankguard_bin", self.rankguard_bin)
        if self.script.startswith("-"):
            raise ValueError(
                f"script: {self.script!r} looks like an option; options go before the "
                "KEY=VALUE words and the script"
            )
        if self.nodes < 1:
            raise ValueError(f"nodes: must be >= 1, got {self.nodes}")
        if self.ntasks_per_node != 1:
            raise ValueError(
                "ntasks_per_node: must be 1 (one rankguard launcher per node starts its "
                f"ranks), got {self.ntasks_per_node}"
            )
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node: must be >= 0, got {self.gpus_per_node}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node: must be >= 1, got {self.nproc_per_node}")
        if not _TIME_RE.match(self.time_limit):
            raise ValueError(
                "time_limit: expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, "
                f"got {self.time_limit!r}"
            )
        for name in ("partition", "account", "log_dir"):
            value = getattr(self, name)
            if value is not None:
                _one_line(name, value)
        if self.num_job_retries_on_failure < 0:
            raise ValueError(
                f"num_job_retries_on_failure: must be >= 0, got {self.num_job_retries_on_failure}"
            )
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError(f"max_restarts: must be >= 0, got {self.max_restarts}")
        if not 1 <= self.rdzv_port <= 65535:
            raise ValueError(f"rdzv_port: must be in [1, 65535], got {self.rdzv_port}")
        if self.signal is not None and not _SIGNAL_RE.match(self.signal):
            raise ValueError(
                f"signal: expected [R|B:]SIGNAL[@SECONDS] such as TERM@60, got {self.signal!r}"
            )
        for i, line in enumerate(self.extra_sbatch):
            _one_line(f"extra_sbatch[{i}]", line)
            if not _strip_sbatch(line).startswith("-"):
                raise ValueError(
                    f"extra_sbatch[{i}]: expected an option such as --exclusive, got {line!r}"
                )
        for name in ("rankguard_args", "script_args"):
            for i, arg in enumerate(getattr(self, name)):
                if "\0" in arg:
                    raise ValueError(f"{name}[{i}]: must not contain a NUL byte")


def _strip_sbatch(line: str) -> str:
    line = line.strip()
    if line.startswith("#SBATCH"):
        line = line[len("#SBATCH") :].strip()
    return line


def _directive(option: str, value: str | int) -> str:
    return f"#SBATCH --{option}={shlex.quote(str(value))}"


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _directives(spec: SbatchSpec) -> list[str]:
    lines = [
        _directive("job-name", spec.job_name),
        _directive("nodes", spec.nodes),
        _directive("ntasks-per-node", spec.ntasks_per_node),
    ]
    if spec.gpus_per_node:
        lines.append(_directive("gpus-per-node", spec.gpus_per_node))
    lines.append(_directive("time", spec.time_limit))
    if spec.partition is not None:
        lines.append(_directive("partition", spec.partition))
    if spec.account is not None:
        lines.append(_directive("account", spec.account))
    lines += [
        _directive("output", spec.output),
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
    ]
    if spec.signal is not None:
        lines.append(_directive("signal", spec.signal))
    # Extra lines are the user's own sbatch syntax: passed through, one option each.
    lines += [f"#SBATCH {_strip_sbatch(line)}" for line in spec.extra_sbatch]
    return lines


def _launch_lines(spec: SbatchSpec) -> list[str]:
    """``rankguard run`` words after the per-node ones: its options, the user's extra
    arguments, then the script and its arguments (one continuation line each)."""
    words = ["--nproc-per-node", str(spec.nproc_per_node)]
    if spec.log_dir is not None:
        words += ["--log-dir", spec.log_dir]
    if spec.max_restarts is not None:
        words += ["--max-restarts", str(spec.max_restarts)]
    lines = [_join(words)]
    if spec.rankguard_args:
        lines.append(_join(spec.rankguard_args))
    lines.append(_join([spec.script, *spec.script_args]))
    return lines


_BODY = r"""
set -u

RG_MAX_JOB_RETRIES=__MAX_RETRIES__
RG_RETRYABLE_CODES=__RETRYABLE__
RG_RDZV_PORT=__PORT__

rg_log() {
    printf '[rankguard slurm %s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
}

# rg_decide EXIT_CODE RESTART_COUNT MAX_RETRIES -> DONE | REQUEUE | GIVE_UP
# (the shell twin of rankguard.slurm.retry.decide)
rg_decide() {
    if [ "$1" -eq 0 ]; then echo DONE; return; fi
    if [ "$1" -eq __PREEMPTED__ ]; then echo REQUEUE; return; fi
    case " $RG_RETRYABLE_CODES " in
        *" $1 "*) ;;
        *) echo GIVE_UP; return ;;
    esac
    if [ "$2" -lt "$3" ]; then echo REQUEUE; else echo GIVE_UP; fi
}

# After an exit 17 (the rerun state machine found the first run's GPU faulty) or 15 (a
# node excluded itself: bad GPU, too many restarts), leave out the hosts named in
# RANKGUARD_EXCLUDE_FILE (rank 0, exit 17) and RANKGUARD_EXCLUDE_FILE.node.* (each
# excluded node), and those of earlier retries: this job is submitted again with
# --exclude (Slurm takes no ExcNodeList for a running job, and a requeue ends this
# script at once). 0 when the new job is queued; 1 (requeue as is) otherwise.
rg_resubmit() {
    for rg_f in "$RANKGUARD_EXCLUDE_FILE" "$RANKGUARD_EXCLUDE_FILE".node.*; do
        if [ -s "$rg_f" ]; then
            tr ',' '\n' < "$rg_f" >> "$RANKGUARD_EXCLUDE_FILE.all"
            echo >> "$RANKGUARD_EXCLUDE_FILE.all"
        fi
    done
    if [ ! -s "$RANKGUARD_EXCLUDE_FILE.all" ]; then
        rg_log "warning: exit $1 but no host named in $RANKGUARD_EXCLUDE_FILE: requeue as is"
        return 1
    fi
    RG_EXC=$(grep -v '^$' "$RANKGUARD_EXCLUDE_FILE.all" | sort -u | paste -sd, -)
    rg_log "exclude: $RG_EXC (exit $1: a faulty GPU or node there): sbatch" \
        "--exclude=$RG_EXC --dependency=afterany:$RG_JOB_ID (run $RG_RUN_ID)"
    if RG_NEW=$(env -u SLURM_RESTART_COUNT RANKGUARD_SLURM_RUN_ID="$RG_RUN_ID" \
        RANKGUARD_SLURM_RETRIES=$((RG_RESTART_COUNT + 1)) \
        sbatch --parsable --exclude="$RG_EXC" --dependency="afterany:$RG_JOB_ID" "$0"); then
        rg_log "resubmit: code $1 is retryable, $RG_RETRY: job ${RG_NEW%%;*} runs" \
            "without $RG_EXC"
        return 0
    fi
    rg_log "warning: sbatch failed: requeued as is, the job may run there again"
    return 1
}

RG_JOB_ID=${SLURM_JOB_ID:?not inside a Slurm job: SLURM_JOB_ID is not set}
# A job submitted again without excluded hosts keeps its first job's id as the run id.
RG_RUN_ID=${RANKGUARD_SLURM_RUN_ID:-$RG_JOB_ID}
# Where rank 0 names the faulty hosts behind an exit 17 (the submit directory: shared).
export RANKGUARD_EXCLUDE_FILE="${SLURM_SUBMIT_DIR:-$PWD}/.rankguard_exclude_$RG_RUN_ID"
rm -f "$RANKGUARD_EXCLUDE_FILE" "$RANKGUARD_EXCLUDE_FILE".node.*
RG_NNODES=${SLURM_NNODES:?SLURM_NNODES is not set}
RG_RESTART_COUNT=0
for rg_count in "${SLURM_RESTART_COUNT:-0}" "${RANKGUARD_SLURM_RETRIES:-0}"; do
    case "$rg_count" in
        '' | *[!0-9]*)
            rg_log "warning: a restart count '$rg_count' is not a number; counting it as 0" ;;
        *) RG_RESTART_COUNT=$((RG_RESTART_COUNT + rg_count)) ;;
    esac
done

RG_HOST=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}" | head -n1)
if [ -z "$RG_HOST" ]; then
    rg_log "give up: no host name in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
    exit 1
fi
RG_ENDPOINT="$RG_HOST:$RG_RDZV_PORT"

rg_log "start: job $RG_JOB_ID (run $RG_RUN_ID), run $((RG_RESTART_COUNT + 1)) of at most" \
    "$((RG_MAX_JOB_RETRIES + 1)), $RG_NNODES node(s), rendezvous $RG_ENDPOINT"

# One launcher per node. The node rank must be read inside each task, hence bash -c with a
# constant command line; every other word reaches it as a positional argument ($0 is the
# rankguard executable). --kill-on-bad-exit=0: a failing node does not kill the others,
# each launcher ends its own ranks and reports through its exit code.
# srun in the background, so that the exit signal (Slurm's B: signal) reaches this shell's
# trap at once (bash runs a trap only between commands); the trap passes it to the job's
# steps (scancel without --batch: every launcher and its ranks, not this shell), and the
# script waits again for srun's exit code. Not to srun itself: srun ends its step on
# SIGTERM ("forcing job termination": the launchers killed before they can save).
rg_forward() {
    rg_log "received SIG$1: passed to the launchers (preemption: they save and exit 14)"
    if ! scancel --signal="$1" "$RG_JOB_ID"; then
        rg_log "warning: scancel --signal=$1 $RG_JOB_ID failed: the launchers were not told"
    fi
}
srun --kill-on-bad-exit=0 --ntasks-per-node=1 \
    bash -c 'exec "$0" run --node-rank "$SLURM_NODEID" "$@"' __RANKGUARD__ \
    --nnodes "$RG_NNODES" --rdzv-backend c10d --rdzv-endpoint "$RG_ENDPOINT" \
    --rdzv-id "$RG_RUN_ID" \
    __LAUNCH__ &
RG_SRUN_PID=$!
for rg_sig in TERM USR1 USR2; do
    trap "rg_forward $rg_sig" "$rg_sig"
done
RG_CODE=0
while :; do
    wait "$RG_SRUN_PID"
    RG_CODE=$?
    kill -0 "$RG_SRUN_PID" 2>/dev/null || break  # a trap interrupted wait: srun still runs
done
# The launchers have ended: a signal from now on (the TERM of this script's own
# `scontrol requeue`, a late preemption) has nobody to save; said as such, not passed on.
rg_late() {
    rg_log "received SIG$1 after the launchers ended (code $RG_CODE): nothing to pass on"
}
for rg_sig in TERM USR1 USR2; do
    trap "rg_late $rg_sig" "$rg_sig"
done
rg_log "rankguard run exited with code $RG_CODE (highest over the nodes)"

RG_DECISION=$(rg_decide "$RG_CODE" "$RG_RESTART_COUNT" "$RG_MAX_JOB_RETRIES")
case "$RG_DECISION" in
    DONE)
        rg_log "done: training completed"
        exit 0 ;;
    REQUEUE)
        RG_RETRY="job retry $((RG_RESTART_COUNT + 1)) of $RG_MAX_JOB_RETRIES"
        if { [ "$RG_CODE" -eq 17 ] || [ "$RG_CODE" -eq 15 ]; } && rg_resubmit "$RG_CODE"; then
            exit "$RG_CODE"
        fi
        rg_log "requeue: code $RG_CODE is retryable, $RG_RETRY: scontrol requeue $RG_JOB_ID"
        if ! scontrol requeue "$RG_JOB_ID"; then
            rg_log "give up: scontrol requeue $RG_JOB_ID failed"
        fi
        exit "$RG_CODE" ;;
    *)
        case " $RG_RETRYABLE_CODES " in
            *" $RG_CODE "*)
                rg_log "give up: code $RG_CODE is retryable but the job used its" \
                    "$RG_MAX_JOB_RETRIES retries" ;;
            *)
                rg_log "give up: code $RG_CODE is not retryable" \
                    "(retryable: $RG_RETRYABLE_CODES)" ;;
        esac
        exit "$RG_CODE" ;;
esac
"""


def render_sbatch(spec: SbatchSpec) -> str:
    """The complete sbatch script for ``spec`` (bash; submit with ``sbatch FILE``)."""
    retryable = " ".join(str(c) for c in sorted(RETRYABLE))
    header = [
        "#!/bin/bash",
        *_directives(spec),
        "",
        f"# Generated by `rankguard slurm sbatch` (rankguard {__version__}); see docs/slurm.md.",
        "# rankguard run restarts the ranks inside the job; when it gives up with a retryable",
        f"# exit code ({retryable}) this script requeues the job, at most "
        f"{spec.num_job_retries_on_failure} time(s).",
    ]
    launch = " \\\n    ".join(_launch_lines(spec))
    body = (
        _BODY.replace("__MAX_RETRIES__", str(spec.num_job_retries_on_failure))
        .replace("__RETRYABLE__", shlex.quote(retryable))
        .replace("__PORT__", str(spec.rdzv_port))
        .replace("__PREEMPTED__", str(EXIT_PREEMPTED))
        .replace("__RANKGUARD__", shlex.quote(spec.rankguard_bin))
        .replace("__LAUNCH__", launch)
    )
    return "\n".join(header) + "\n" + body


def parse_job_id(sbatch_stdout: str) -> str | None:
    """The job id in sbatch's ``Submitted batch job 4242`` (or ``--parsable``'s ``4242``)."""
    match = _JOB_ID_RE.search(sbatch_stdout)
    if match:
        return match.group(1)
    text = sbatch_stdout.strip()
    parsable = re.match(r"^(\d+)(?:;\S+)?$", text)
    return parsable.group(1) if parsable else None
