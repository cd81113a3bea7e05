"""The demo's NaN faults: which attempt's loss is NaN."""

from __future__ import annotations

from rankguard.demo.train import inject_nan, parse_args


def _args(fault: str) -> object:
    return parse_args(["--fault", fault, "--fault-step", "3", "--fault-rank", "2"])


def test_a_bad_gpu_nan_is_gone_in_the_rerun_after_the_resume_whatever_the_restart_count() -> None:
    # an agent that restarted its group for a node waiting to join, before it saw its own
    # rank's exit 16, keeps torch's restart count at 0: the re-run after the resume is
    # another attempt all the same, and a faulty GPU's NaN is not there any more
    args = _args("nan-bad-gpu")
    assert inject_nan(args, 2, 3, 0, rerunning=False)  # the first attempt
    assert inject_nan(args, 2, 3, 0, rerunning=True)  # its re-run in place: the same
    assert not inject_nan(args, 2, 3, 0, rerunning=True, resumed=True)
    assert not inject_nan(args, 2, 3, 1, rerunning=True, resumed=True)
    assert not inject_nan(args, 1, 3, 0, rerunning=False)  # another rank
    assert not inject_nan(args, 2, 4, 0, rerunning=False)  # another step


def test_a_persistent_nan_stays_after_the_resume_and_a_transient_one_is_once() -> None:
    persistent, once = _args("nan-persistent"), _args("nan")
    assert inject_nan(persistent, 2, 3, 1, rerunning=True, resumed=True)
    assert inject_nan(once, 2, 3, 0, rerunning=False)
    assert not inject_nan(once, 2, 3, 0, rerunning=True)
