"""Exit codes of ``rankguard run`` (what a scheduler wrapper decides retries on).

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
| 128+N | | the launcher was stopped by signal N | scheduler's call |
"""

from __future__ import annotations

__all__ = [
    "EXIT_CRASH",
    "EXIT_FAILED",
    "EXIT_HANG",
    "EXIT_NO_RESTART",
    "EXIT_OK",
    "EXIT_STRAGGLER",
    "EXIT_UNHEALTHY_GPU",
    "EXIT_USAGE",
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

RETRYABLE = frozenset({EXIT_UNHEALTHY_GPU, EXIT_HANG, EXIT_CRASH, EXIT_STRAGGLER})
