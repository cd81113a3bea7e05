"""The agent's worker pids, as torch elastic reports them when a group starts."""

from __future__ import annotations

from rankguard.launcher.agent import worker_pids


class FakeContext:
    def pids(self) -> dict[int, int]:
        return {0: 4101, 1: 4102}


def test_pids_from_what_start_workers_returned() -> None:
    assert worker_pids({0: 4201, 1: 4202}, FakeContext()) == [4201, 4202]


def test_pids_from_the_process_context_otherwise() -> None:
    assert worker_pids(None, FakeContext()) == [4101, 4102]


def test_no_pids_means_no_worker() -> None:
    assert worker_pids(None, None) == []
    assert worker_pids(None, object()) == []
