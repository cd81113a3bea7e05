"""The monitor's last word on a run: a final state whatever ended it, an end held back
for its cause judged before the launcher goes, no restart claimed that never came, and
``findings.jsonl`` there from the start."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.layout import FINDINGS_FILE
from tests.factories import (
    BASE_NS,
    FakeClock,
    heartbeat_config,
    publisher_record,
    read_jsonl,
    read_status,
)
from tests.factories import write_heartbeats as write

RUN = "run-end"
rec = partial(publisher_record, run_id=RUN)
CLEAN = {"clean": True, "exit_code": 0, "error": None}
STOPPED = {**CLEAN, "stopped_at": 1}  # left at the agreed stop step (should_stop said stop)
PEER = {
    "clean": False,
    "exit_code": 1,
    "error": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4242",
}
VANISHED = {
    "clean": False,
    "exit_code": None,
    "error": "process vanished without process_end (killed by a signal or hard crash)",
    "vanished": True,
}


def _monitor(run_dir: Path, clock: Any = None, **kw: Any) -> JobMonitor:
    return JobMonitor(
        heartbeat_config(scan_interval_s=0.05),
        run_dir,
        RUN,
        expected_world_size=2,
        check_pids=False,
        clock=clock or FakeClock(),
        **kw,
    )


def test_findings_file_exists_from_the_start_empty(tmp_path: Path) -> None:
    mon = _monitor(tmp_path)
    mon.start()
    try:
        assert (tmp_path / FINDINGS_FILE).read_bytes() == b""
    finally:
        mon.stop()


def test_a_peer_failure_held_for_its_cause_is_judged_before_the_end(tmp_path: Path) -> None:
    """Rank 1 leaves early (exit 0), rank 0 dies with "Connection closed by peer": its
    end waits a relay period for a cause that never comes; the launcher ends first."""
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    write(
        tmp_path,
        rec(1, 1, event="process_end", exit=CLEAN),
        rec(0, 2, event="process_end", exit=PEER),
    )
    clock.t += 0.1
    assert mon.scan_once() == []  # held: its cause may come from another node
    mon.note_end(None)  # the launcher's run is over (it has no word of its own)
    status = mon.stop(drain_timeout_s=0.0)
    assert status["state"] == "failed"
    (finding,) = read_jsonl(tmp_path / FINDINGS_FILE)
    assert (finding["finding_type"], finding["rank"]) == ("rank_process_exited", 0)
    assert finding["exit"]["peers_ended_first"] == [1]
    assert "its peer(s) 1 had exited cleanly before it" in finding["message"]
    assert mon.episode_findings() == [finding]


def test_ends_after_a_restart_that_never_came_are_not_called_restarts(tmp_path: Path) -> None:
    """Fault tolerance kills a hung rank with no restart left: the ranks' ends were
    noted as the restart's, but no new group came up: the job failed, nothing
    restarted."""
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    mon.note_restart("restart after gpu_progress_timeout on rank 1")
    write(
        tmp_path,
        rec(0, 1, event="process_end", exit=VANISHED),
        rec(1, 1, event="process_end", exit=VANISHED),
    )
    clock.t += 0.1
    assert mon.scan_once() == []
    assert read_status(tmp_path)["state"] not in ("failed", "completed", "stopped")
    mon.note_end("failed")
    status = mon.stop(drain_timeout_s=0.0)
    assert status["state"] == "failed"
    assert read_status(tmp_path)["state"] == "failed"
    for row in status["ranks"]:
        assert "after_restart" not in row["exit"]
        assert row["exit"]["after_action"] == (
            "restart after gpu_progress_timeout on rank 1; no new group started: the job ended"
        )


@pytest.mark.parametrize(("said", "state"), [(None, "failed"), ("completed", "completed")])
def test_ranks_never_seen_ending_end_in_a_final_state(
    tmp_path: Path, said: str | None, state: str
) -> None:
    mon = _monitor(tmp_path)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    mon.note_end(said)
    assert mon.stop(drain_timeout_s=0.0)["state"] == state


def test_a_monitor_that_moves_to_another_node_leaves_no_final_state(tmp_path: Path) -> None:
    """A renumbered node stops its monitor while the job goes on (no note_end)."""
    mon = _monitor(tmp_path)
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    assert mon.stop(drain_timeout_s=0.0)["state"] == "running"


def test_the_launchers_failure_is_the_final_state(tmp_path: Path) -> None:
    mon = _monitor(tmp_path)
    write(
        tmp_path,
        rec(0, 0),
        rec(1, 0),
        rec(0, 1, event="process_end", exit=CLEAN),
        rec(1, 1, event="process_end", exit=CLEAN),
    )
    mon.note_end("failed")  # every rank ended cleanly, the agent's exit barrier did not
    assert mon.stop(drain_timeout_s=0.0)["state"] == "failed"
    with pytest.raises(ValueError, match="outcome 'running'"):
        mon.note_end("running")


def test_a_preempted_job_is_stopped_although_every_rank_ended_cleanly(tmp_path: Path) -> None:
    """Every rank left cleanly at the agreed stop step of a preemption: the training did
    not complete (it said ``completed``)."""
    from rankguard.launcher.run import _end_word

    mon = _monitor(tmp_path)
    write(
        tmp_path,
        rec(0, 0),
        rec(1, 0),
        rec(0, 1, event="process_end", exit=STOPPED),
        rec(1, 1, event="process_end", exit=STOPPED),
    )

    class Result:
        def is_failed(self) -> bool:
            return False

    assert _end_word(Result(), None) == "completed"
    mon.note_end(_end_word(Result(), None, preempted=True))
    assert mon.stop(drain_timeout_s=0.0)["state"] == "stopped"


@pytest.mark.parametrize("preempted", [True, False])
def test_ranks_that_finished_training_before_the_stop_step_completed(
    tmp_path: Path, preempted: bool
) -> None:
    """A stop step was agreed (the preemption signal, or a straggler with
    ``stop_if_detected``), but every rank finished its loop and exited 0 before reaching
    it (none says it left at the request): the job completed, not ``stopped``."""
    from rankguard.launcher.run import _end_word

    mon = _monitor(tmp_path)
    signal = {"preempt": {"signal_received": True, "asks_stop": True}} if preempted else {}
    write(
        tmp_path,
        rec(0, 0),
        rec(1, 0),
        rec(0, 1, event="process_end", exit=CLEAN, **signal),
        rec(1, 1, event="process_end", exit=CLEAN, **signal),
    )

    class Result:
        def is_failed(self) -> bool:
            return False

    mon.note_end(_end_word(Result(), None, preempted=preempted, agreed_stop=not preempted))
    assert mon.stop(drain_timeout_s=0.0)["state"] == "completed"


def test_a_preempted_rank_of_a_script_that_never_asks_should_stop_is_no_completion(
    tmp_path: Path,
) -> None:
    """A script that never asks ``should_stop()`` may leave at the preemption signal
    with a save of its own and exit 0: not a completed training (the job is requeued)."""
    from rankguard.launcher.run import _end_word

    mon = _monitor(tmp_path)
    signal = {"preempt": {"signal_received": True}}
    write(
        tmp_path,
        rec(0, 0),
        rec(1, 0),
        rec(0, 1, event="process_end", exit=CLEAN, **signal),
        rec(1, 1, event="process_end", exit=CLEAN, **signal),
    )

    class Result:
        def is_failed(self) -> bool:
            return False

    mon.note_end(_end_word(Result(), None, preempted=True))
    assert mon.stop(drain_timeout_s=0.0)["state"] == "stopped"


def test_the_root_causes_findings_outlive_a_restart_noted_but_not_its_new_group(
    tmp_path: Path,
) -> None:
    """Fault tolerance notes a restart as it kills (none may follow): the episode's
    findings stay; once the ranks' processes are replaced, they are the past."""
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0), rec(1, 0), rec(1, 1, event="process_end", exit=VANISHED))
    clock.t += 0.1
    (died,) = mon.scan_once()
    mon.note_restart("restart after rank_process_exited on rank 1")
    assert [f["rank"] for f in mon.episode_findings()] == [1] == [died.rank]
    for rank in (0, 1):  # the new group
        started = rec(rank, 0, pid=5000 + rank, event="process_start", progress_seq=0)
        started["wall_time_ns"] = BASE_NS + 60_000_000_000
        write(tmp_path, started)
    clock.t += 0.1
    mon.scan_once()
    assert mon.episode_findings() == []
