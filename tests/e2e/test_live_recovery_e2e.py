"""End to end: live recovery under the real ``rankguard run`` (3 CPU ranks on gloo, the
demo model in DDP, deterministic data). One launch with ``--preload torch`` (the ranks,
the standby and its refill forked from the fork server): a hung rank taken over by the
standby in place, the standby refilled (a new standby forked into the lost process's
slot, said ready), a SIGKILLed rank taken over by the refilled one, then a third loss
(the refilled one, killed in its turn) with no standby left (the group restart, said);
the restarted group's standby, not needed, leaves with the ranks and writes nothing. A
second launch, its ranks and standbys started afresh (no ``--preload``): a SIGSTOPped
rank, found by its heartbeat timeout and killed by fault tolerance, replaced live, and a
new standby started in its place.

Why a real launch: only the agent's own watch of the worker processes (torch elastic's
``MultiprocessContext`` of forked workers, or its subprocesses), the standby processes
and the ranks' in-process rounds together show that the survivors keep their pids and
the job goes on without a group restart, and that a refill forked later is a worker of
the same context (its standby's wait reached). The launcher's decisions alone (a
script that declares no state restarts the group, saying so in one line; a standby
ending early; the group restart when none is left) are tested on fake processes in
``tests/unit/launcher/test_live.py`` and ``tests/unit/live/test_plan.py``; the view of
the forked workers on a real context in ``tests/unit/launcher/test_live_forked.py``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    heartbeat_files,
    no_leftover_workers,
    read_jsonl,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LIVE = [
    "--set",
    "inprocess_restart.enabled=true",
    "--set",
    "inprocess_restart.soft_timeout=3",
    "--set",
    "inprocess_restart.hard_timeout=6",
    # gloo: a survivor waiting on the lost rank in a ring collective is released by
    # the group's timeout (docs/live_recovery.md)
    "--set",
    "inprocess_restart.process_group_timeout=2",
    "--set",
    "inprocess_restart.heartbeat_interval=0.2",
    "--set",
    "inprocess_restart.heartbeat_timeout=3",
]
# the loss as the demo prints it (``.4f``): an unbuffered ``print`` writes the line and
# its newline apart, and another process's line may come between the two
_LOSS = re.compile(r"\[demo\] step (\d+)/\d+ loss (-?(?:\d+\.\d{4}|nan|inf))")
_READY = re.compile(r"live recovery: new standby pid (\d+) ready \(([\d.]+) s after its start\)")


def _job(
    tmp_path: Path,
    run_id: str,
    nproc: int,
    *args: str,
    standbys: int = 1,
    refills: int | None = None,
    preload: tuple[str, ...] = (),
) -> tuple[str, int, Path]:
    launch = [] if refills is None else ["--set", f"inprocess_restart.standby_refills={refills}"]
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=nproc),
            *preload,
            "--standby-ranks",
            str(standbys),
            "--max-restarts",
            "1",
            *LIVE,
            *launch,
            "-m",
            "rankguard.demo.train",
            "--log-every",
            "1",
            "--step-sleep",
            "0.05",
            *args,
        ],
        timeout=280,
    )
    return res.stdout + res.stderr, res.returncode, tmp_path / "heartbeat" / run_id


def _attempts(out: str) -> list[dict[int, float]]:
    """Rank 0's loss per step, one dict per attempt (the steps start again at 1)."""
    attempts: list[dict[int, float]] = [{}]
    last = 0
    for step_s, loss_s in _LOSS.findall(out):
        step = int(step_s)
        if step < last - 1:  # a new attempt (an in-process redo goes back one at most)
            attempts.append({})
        attempts[-1][step] = float(loss_s)
        last = step
    return attempts


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_lost_ranks_are_replaced_in_place_then_no_standby_left_restarts(
    tmp_path: Path, run_id: str
) -> None:
    """The ranks, the standby and its refill forked from the ``--preload torch`` fork
    server. Rank 2 hangs past the hard timeout after step 4 (the standby takes it, and
    the node forks a new one in its place: one refill allowed), rank 1 is SIGKILLed after
    step 8 (the refilled standby takes it), and rank 1 again after step 20 (the refilled
    standby, now rank 1): no standby left, the group restart; the next attempt runs from
    step 1 without a fault: the reference losses, and its new standby, never needed,
    leaves with the ranks unused, with no finding, no restart and no heartbeat of its
    own. Rank 0 trains 11 steps (about a second) after the second recovery, so that its
    heartbeats (published every 0.5 s, sampling the iteration) show a step after it.

    Three ranks, not four: the survivor that keeps its process through both recoveries
    is rank 0, each loss is one rank's, and the third loss is the refilled standby
    itself (a process that took a rank lost in its turn), so a fourth rank adds only
    its start-up (two interpreters: its first and its restarted process)."""
    out, rc, run_dir = _job(
        tmp_path,
        run_id,
        3,
        *("--steps", "25", "--kill-at", "1:8", "--kill-at", "1:20"),
        *("--fault", "wedge", "--fault-rank", "2", "--fault-step", "4"),
        *("--fault-duration", "60"),
        standbys=1,
        refills=1,
        preload=("--preload", "torch"),
    )
    assert rc == 0, out[-4000:]
    lines = read_jsonl(run_dir / "restarts.jsonl")
    kinds = [line["kind"] for line in lines]
    assert kinds == ["live_recovery", "live_recovery", "process"], lines
    hung, killed, group = lines
    assert (hung["lost_rank"], hung["exit"]) == (2, "exit code 124")  # the hard timeout
    assert (killed["lost_rank"], killed["exit"]) == (1, "SIGKILL")
    for live in (hung, killed):
        assert live["cause"] == "rank_process_exited"
        assert live["resumed_t"] is not None and live["resumed_t"] > live["fault_t"]
        assert live["steps_redone"] <= 1
    assert (hung["resumed_step"], killed["resumed_step"]) == (5, 9)
    assert group["rank"] == 1
    assert out.count("is taken over by standby pid") == 2
    # the standby used for the hang was refilled, and the new one took the second loss
    assert out.count("started in place of rank") == 1
    assert (
        f"live recovery: new standby pid {killed['standby_pid']} started in place of rank "
        "2's lost process; standbys on this node: 1 waiting, 1 used, 1 started to refill"
    ) in out
    # the refill forked later reached its standby's wait before the second loss: the
    # forked context's worker, not a group restart
    ready = {int(pid): float(secs) for pid, secs in _READY.findall(out)}
    assert killed["standby_pid"] in ready, out[-4000:]
    assert (
        "live recovery cannot apply: rank 1 (SIGKILL) lost and no standby left on this "
        "node: the worker group restarts" in out
    )
    # the findings naming the lost ranks are written, as without live recovery
    findings = read_jsonl(run_dir / "findings.jsonl")
    exits = {(f["rank"], f["pid"]) for f in findings if f["finding_type"] == "rank_process_exited"}
    assert {(2, hung["lost_pid"]), (1, killed["lost_pid"])} <= exits, findings
    # each live recovery is also an in-process restart of the survivors, named by its rank
    reentries = [f for f in findings if f["finding_type"] == "inprocess_restart"]
    assert sorted(f["rank"] for f in reentries) == [1, 2], findings
    # waiting for a standby still starting is the recovery, not a stuck re-entry
    assert not [f for f in findings if f["finding_type"] == "rank_section_timeout"], findings
    # the survivor kept its pid; each standby's pid became the rank it replaced
    by_pid = {recs[0]["pid"]: recs for recs in map(_records, heartbeat_files(run_dir))}

    def steps_of(pid: int) -> set[int]:
        return {r.get("iteration") or 0 for r in by_pid[pid]} - {0}

    def live_rounds(pid: int) -> int:
        return max((r.get("inprocess") or {}).get("restarts", 0) for r in by_pid[pid])

    survivors = {
        recs[0]["rank"]: pid
        for pid, recs in by_pid.items()
        if recs[0]["rank"] == 0 and live_rounds(pid) == 2
    }
    assert sorted(survivors) == [0], sorted(by_pid)
    for rank, pid in survivors.items():  # one process from before the hang (after step
        # 4) through both recoveries (heartbeats sample the iteration: not every step)
        assert min(steps_of(pid)) <= 4 and max(steps_of(pid)) > 9, (rank, sorted(steps_of(pid)))
    assert by_pid[hung["standby_pid"]][0]["rank"] == 2
    assert min(steps_of(hung["standby_pid"])) >= 5  # it never trained before it took over
    assert by_pid[killed["standby_pid"]][0]["rank"] == 1
    assert min(steps_of(killed["standby_pid"])) >= 9
    # the losses of the live attempt are an uninterrupted run's (the attempt after the
    # group restart ran from step 1 without a fault); the rebuilt DDP sums its first
    # buckets in another order: equal to float rounding, not bit for bit
    first, second = _attempts(out)
    assert sorted(first) == list(range(1, 21)), first
    assert sorted(second) == list(range(1, 26)), second
    for step, loss in first.items():
        assert math.isclose(loss, second[step], rel_tol=1e-3), (step, loss, second[step])
    # the restarted group ran healthy with a new standby: nothing said about them
    # from the group restart to the run's last lines, no finding of its processes, and
    # it left with the ranks unused
    after = out.split("no standby left on this node: the worker group restarts", 1)[1]
    after = after.split("[rankguard] run completed: ", 1)[0]
    # node 0's monitor may say the first group's second live recovery a scan late (a
    # loaded machine: the rank's 11 steps after it take about a second): that line is
    # about the first group, and it is checked above
    first_groups = re.compile(r"in-process restart [12]: rank_lost on rank [12] ")
    after = "\n".join(line for line in after.splitlines() if not first_groups.search(line))
    assert "live recovery" not in after and "standby" not in after, after[-4000:]
    first_group = {*survivors.values(), hung["lost_pid"], killed["lost_pid"]}
    first_group |= {hung["standby_pid"], killed["standby_pid"]}
    second_group = set(by_pid) - first_group
    assert sorted(by_pid[pid][0]["rank"] for pid in second_group) == [0, 1, 2], sorted(by_pid)
    assert not {f["pid"] for f in findings} & second_group, findings
    status = json.loads((run_dir / "status.json").read_text())
    assert status["summary"]["findings_total"] == len(findings)
    live = status["live"]
    assert (live["standbys_per_node"], live["waiting"], live["left_unused"]) == (1, 0, 1), live
    assert (live["used"], len(live["replaced"]), live["started"]) == (2, 2, 1), live
    # heartbeats: the first group's three ranks, its standby and the refilled one once
    # they took a rank, the second group's three ranks; the second group's standby wrote
    # none
    assert sorted(p.name.split("_pid_")[0] for p in heartbeat_files(run_dir)) == [
        *["rank_0"] * 2,
        *["rank_1"] * 3,
        *["rank_2"] * 3,
    ]
    assert no_leftover_workers(run_id)


def test_a_stopped_rank_is_killed_once_its_stacks_are_in_and_replaced_live(
    tmp_path: Path, run_id: str
) -> None:
    """Rank 1 SIGSTOPs itself after step 5 (the demo lets it run again after 60 s): the
    heartbeat timeout names it, fault tolerance writes its stacks (py-spy reads a
    stopped process as it is: it is not let run) and kills it at once, the standby takes
    its place. One finding names the hang; no second one for the process fault tolerance
    ended, and the survivor's wait in the round stays under its hard timeout. The ranks
    and standbys are new interpreters (no ``--preload``), and one refill is allowed: a
    new standby started afresh in place of the used one."""
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=2),
            "--standby-ranks",
            "1",
            *LIVE,
            # one standby started afresh in place of the used one (the first job's refill
            # is forked: this is the refill started as a new interpreter)
            *("--set", "inprocess_restart.standby_refills=1"),
            *("--set", "fault_tolerance.enable_ft_package=true"),
            *("--set", "fault_tolerance.num_in_job_restarts=1"),
            "-m",
            "rankguard.demo.train",
            *("--steps", "14", "--log-every", "1", "--step-sleep", "0.05"),
            *("--fault", "stop", "--fault-rank", "1", "--fault-step", "5"),
            *("--fault-duration", "60"),
        ],
        timeout=280,
    )
    out, run_dir = res.stdout + res.stderr, tmp_path / "heartbeat" / run_id
    assert res.returncode == 0, out[-4000:]
    (line,) = read_jsonl(run_dir / "restarts.jsonl")
    assert line["kind"] == "live_recovery" and line["lost_rank"] == 1, line
    assert (line["cause"], line["exit"]) == ("rank_process_heartbeat_timeout", "SIGKILL"), line
    assert line["resumed_t"] is not None and line["steps_redone"] <= 1, line
    findings = read_jsonl(run_dir / "findings.jsonl")
    mine = [f for f in findings if f.get("pid") == line["lost_pid"]]
    assert [(f["finding_type"], f["action"]) for f in mine] == [
        ("rank_process_heartbeat_timeout", "restart")
    ], findings
    assert not [f for f in findings if f["finding_type"] == "rank_section_timeout"], findings
    # a new standby started afresh in the lost process's slot (ended with the job if
    # still starting)
    assert "started in place of rank 1's lost process" in out, out[-4000:]
    stacks = Path(mine[0]["stack_dump"]).read_text(encoding="utf-8")
    if "py-spy dump" in stacks:  # py-spy on PATH: the stopped rank read as it is
        assert "--nonblocking" in stacks, stacks[:500]
    assert no_leftover_workers(run_id)
