"""Exit codes: the one list, shared by the ranks (the rerun state machine exits 16 and
17, a preempted rank 14), the launcher and the sbatch script that decides retries on
them. No torch, no launcher: every layer may import it.

| code | name | meaning | retry the job? |
|---|---|---|---|
| 0 | ``EXIT_OK`` | training completed | no |
| 1 | ``EXIT_FAILED`` | failed, cause not classified | no |
| 2 | ``EXIT_USAGE`` | bad command line or configuration | no |
| 3 | ``EXIT_UNHEALTHY_GPU`` | pre-launch GPU check refused this node | yes, elsewhere |
| 10 | ``EXIT_HANG`` | a hang (heartbeat, progress, section timeout), budget spent | yes |
| 11 | ``EXIT_CRASH`` | a rank crashed and the in-job restart budget is spent | yes |
| 12 | ``EXIT_NO_RESTART`` | a fault whose action is ``abort`` ended the job | no |
| 13 | ``EXIT_STRAGGLER`` | ranks stopped at one step (stop_if_detected) | yes, elsewhere |
| 14 | ``EXIT_PREEMPTED`` | preempted at one stop step, saved or not | yes, always, no retry spent |
| 15 | ``EXIT_NODE_EXCLUDED`` | this node excluded, or too few nodes left | yes, without them |
| 16 | ``EXIT_RERUN_RESUME`` | a failed check reproduced: resume to re-run it | yes, elsewhere |
| 17 | ``EXIT_RERUN_VALIDATION_FAILED`` | the first run's GPU was faulty | yes, without it |
| 18 | ``EXIT_WILL_REPEAT`` | stopped: the failure will repeat (its fingerprint) | no |
| 128+N | | the launcher was stopped by signal N | scheduler's call |

15: bad-node exclusion (its GPU, its restarts, exit 17), the hosts in the run's
``excluded_nodes.json``. 16 and 17 are Megatron's codes. 18: the launcher's restart
decision (:mod:`rankguard.ft.decide`) found that a restart cannot help (a deterministic
failure before the first step, the same failure at the same iteration, attempts without
progress). Which code the launcher exits with is
:func:`rankguard.launcher.exitcodes.exit_code`.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CRASH",
    "EXIT_FAILED",
    "EXIT_HANG",
    "EXIT_NODE_EXCLUDED",
    "EXIT_NO_RESTART",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_RERUN_RESUME",
    "EXIT_RERUN_VALIDATION_FAILED",
    "EXIT_STRAGGLER",
    "EXIT_UNHEALTHY_GPU",
    "EXIT_USAGE",
    "EXIT_WILL_REPEAT",
    "RERUN_CODES",
    "RETRYABLE",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNHEALTHY_GPU = 3
EXIT_HANG = 10
EXIT_CRASH = 11
EXIT_NO_RESTART = 12
EXIT_STRAGGLER = 13
EXIT_PREEMPTED = 14
EXIT_NODE_EXCLUDED = 15
EXIT_RERUN_RESUME = 16
EXIT_RERUN_VALIDATION_FAILED = 17
EXIT_WILL_REPEAT = 18
RERUN_CODES = frozenset({EXIT_RERUN_RESUME, EXIT_RERUN_VALIDATION_FAILED})

RETRYABLE = frozenset(
    {
        EXIT_UNHEALTHY_GPU,
        EXIT_HANG,
        EXIT_CRASH,
        EXIT_STRAGGLER,
        EXIT_RERUN_RESUME,
        EXIT_RERUN_VALIDATION_FAILED,
        EXIT_PREEMPTED,
        EXIT_NODE_EXCLUDED,
    }
)
