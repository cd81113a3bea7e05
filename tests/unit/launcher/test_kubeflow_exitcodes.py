"""``exit_codes: kubeflow``: retryable outcomes in 128-255, the others unchanged."""

from __future__ import annotations

import re

import pytest

from rankguard.config import ConfigError, load_config
from rankguard.launcher import exitcodes, kubeflow
from rankguard.launcher.exitcodes import RETRYABLE
from rankguard.launcher.kubeflow import exit_code_for, kubeflow_exit_code

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
    assert exit_code_for(exitcodes.EXIT_PREEMPTED, cfg.exit_codes) == 214
    assert exit_code_for(exitcodes.EXIT_PREEMPTED, "rankguard") == 14
    with pytest.raises(ConfigError, match="exit_codes"):
        load_config(None, ["exit_codes=k8s"])
