"""``exit_codes: kubeflow``: retryable outcomes in 128-255, the others unchanged."""

from __future__ import annotations

import re

import pytest

from rankguard.config import ConfigError, load_config
from rankguard.launcher import exitcodes
from rankguard.launcher.exitcodes import RETRYABLE
from rankguard.scheduler import SCHEDULERS, for_exit_codes, kubeflow
from rankguard.scheduler.kubeflow import kubeflow_exit_code

CODES = sorted(
    v for k, v in vars(exitcodes).items() if k.startswith("EXIT_") and isinstance(v, int)
)


def kubeflow_retries(code: int) -> bool:
    """Kubeflow's ``ExitCode`` restart policy: 1-127 permanent, 128-255 retryable."""
    return 128 <= code <= 255


@pytest.mark.parametrize("code", CODES)
def test_kubeflow_retries_exactly_rankguards_retryable_outcomes(code: int) -> None:
    mapped = kubeflow_exit_code(code)
    assert 0 <= mapped <= 255
    assert kubeflow_retries(mapped) == (code in RETRYABLE), (code, mapped)
    assert mapped % 100 == code  # the last two digits are still rankguard's code


def test_the_mapped_codes_do_not_collide_with_a_signal_or_each_other() -> None:
    mapped = [kubeflow_exit_code(c) for c in CODES]
    assert len(set(mapped)) == len(mapped)
    assert all(m == c or m > 128 + 64 for m, c in zip(mapped, CODES, strict=True))
    for signal_exit in range(129, 193):  # the launcher stopped by signal N: 128+N
        assert kubeflow_exit_code(signal_exit) == signal_exit


def test_the_documented_table_is_the_mapping() -> None:
    rows = re.findall(r"^\| (\d+) \| (\d+) \|", kubeflow.__doc__ or "", re.M)
    assert {int(a): int(b) for a, b in rows} == {c: kubeflow_exit_code(c) for c in CODES}


def test_the_config_key_chooses_the_table() -> None:
    assert load_config(None, []).exit_codes == "rankguard"
    cfg = load_config(None, ["exit_codes=kubeflow"])
    assert for_exit_codes(cfg.exit_codes).exit_code(exitcodes.EXIT_PREEMPTED) == 214
    assert for_exit_codes("rankguard").exit_code(exitcodes.EXIT_PREEMPTED) == 14
    with pytest.raises(ConfigError, match="exit_codes"):
        load_config(None, ["exit_codes=k8s"])


@pytest.mark.parametrize("code", CODES)
def test_each_scheduler_says_which_codes_it_runs_again(code: int) -> None:
    """Plain: none; Slurm's sbatch script: rankguard's retryable codes; Kubeflow: the
    codes its ExitCode policy retries, as the table maps them."""
    requeued = {s.name: s.requeues(code) for s in SCHEDULERS}
    assert requeued == {
        "plain": False,
        "slurm": code in RETRYABLE,
        "kubeflow": kubeflow_retries(kubeflow_exit_code(code)),
    }
