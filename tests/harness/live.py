"""A live-recovery job as processes: the training ranks and their standbys under the
in-process wrapper on gloo, and the launcher's side
(:class:`~rankguard.launcher.live.LiveRecovery`) watching them as the agent does.

The tier-2 live tests (the shrink with no standby left, sharded state through the
checkpoint manager) differ only in what the ranks train and what they assert; this
module holds what they share:

- :class:`LiveJob` and :func:`rank_main`, the process of one slot (a training rank,
  or a standby from slot ``world`` on): the environment torch elastic gives a worker of
  a run with standbys, its console in ``<out>/stderr_<slot>`` (a forkserver's children
  share the stderr of the test that started the server, not the running test's), the
  wrapper's config (``enabled``, ``gloo`` and the job's timings) and the script's
  function ``train(memory, out, slot, *args)``; a wrapper that gives up
  (``InProcessRestartError``) writes its message to ``<out>/error_<slot>`` and exits 3;
- :func:`run_live`: a ``TCPStore`` on port 0 for the workers, every slot started from
  :func:`~tests.factories.rank_context`, the launcher's side polled until the group is
  no longer healthy or the deadline, each process joined, and what the launcher said
  and wrote (:class:`LiveRun`);
- :func:`read_records`: each slot's ``<out>/<slot>.jsonl``, the steps it trained.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.factories import rank_context

__all__ = ["LiveJob", "LiveRun", "WorkerProc", "rank_main", "read_records", "run_live"]


@dataclass(frozen=True)
class LiveJob:
    """What every slot's process runs: ``world`` training ranks (the slots from
    ``world`` on are standbys), ``train(memory, out, slot, *args)`` under the wrapper
    with ``config`` (fields of ``InProcessRestartConfig`` besides ``enabled`` and
    ``backend``); ``gate``: a standby starts slowly, held until ``<out>/gate`` exists
    (a refill still importing torch)."""

    world: int
    train: Callable[..., int]
    args: tuple[Any, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    gate: bool = False


def rank_main(slot: int, port: int, out: str, job: LiveJob) -> None:
    """The process of ``slot`` (see the module doc); it ends with ``os._exit``."""
    import rankguard.inprocess as ip
    from rankguard.inprocess.config import InProcessRestartConfig
    from rankguard.rank.runenv import RunEnv

    os.environ.update(
        RANKGUARD_STANDBY_RANKS="1",  # a run with standbys
        RANK=str(slot),
        WORLD_SIZE=str(job.world),
        LOCAL_RANK=str(slot),
        LOCAL_WORLD_SIZE=str(job.world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    err = os.open(Path(out) / f"stderr_{slot}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(err, 2)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    if slot >= job.world:
        os.environ["RANKGUARD_STANDBY"] = "1"
        gate = Path(out) / "gate"
        while job.gate and not gate.exists():
            time.sleep(0.05)
    cfg = InProcessRestartConfig(enabled=True, backend="gloo", **job.config)
    env = RunEnv(
        run_id="t",
        rank=slot,
        world_size=job.world,
        restart_count=0,
        master_addr="127.0.0.1",
        master_port=port,
    )
    try:
        ip.wrap(job.train, config=cfg, env=env)({}, Path(out), slot, *job.args)
    except ip.InProcessRestartError as exc:
        (Path(out) / f"error_{slot}").write_text(str(exc))
        os._exit(3)
    os._exit(0)


class WorkerProc:
    """A multiprocessing process as torch elastic's handler shows one (``poll``)."""

    def __init__(self, proc: Any) -> None:
        self._proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


@dataclass
class LiveRun:
    """What the launcher's side ended with (``result``: the last poll's ``RunResult``,
    None when it never polled), what it said, the recoveries' ``restarts.jsonl`` lines
    (every one left, read at the end with the store still up, as the agent's is), each
    slot's exit code and ``status.json["live"]`` as the launcher would write it then."""

    result: Any
    said: list[str]
    entries: list[Any]
    codes: dict[int, int | None]
    status: dict[str, Any]


def run_live(
    out: Path,
    job: LiveJob,
    *,
    standbys: int,
    deadline_s: float,
    poll_s: float,
    refills: int | None = None,
    starting: tuple[int, ...] = (),
    leave_s: float = 0.0,
    on_poll: Callable[[list[str]], None] | None = None,
) -> LiveRun:
    """Run ``job.world`` ranks and ``standbys`` standbys (see the module doc).
    ``refills``: the launcher's ``standby_refills``; ``starting``: slots whose standby
    the launcher watches as a refill still starting (until it is at its wait);
    ``leave_s``: after a FAILED result, how long each process has to leave by itself
    (the wrapper's abandon) before it is killed (0: killed at once, the group restart's
    stop); ``on_poll``: called with what was said after each healthy poll."""
    import torch.distributed as dist
    from torch.distributed.elastic.agent.server.api import WorkerState

    from rankguard.launcher.live import LiveRecovery

    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    said: list[str] = []
    live = LiveRecovery(
        run_id="t", nproc=job.world, standbys=standbys, say=said.append, refills=refills
    )
    group = SimpleNamespace(
        group_rank=0,
        master_addr="127.0.0.1",
        master_port=master.port,
        workers=[SimpleNamespace(world_size=job.world, global_rank=r) for r in range(job.world)],
    )
    live.started(group, 0)
    ctx = rank_context()
    procs = [
        ctx.Process(target=rank_main, args=(s, master.port, str(out), job))
        for s in range(job.world + standbys)
    ]
    for p in procs:
        p.start()
    for slot in starting:  # started as a refill is: watched until it is at its wait
        live._starting[procs[slot].pid] = time.monotonic()
    pcontext = SimpleNamespace(
        subprocess_handlers={s: SimpleNamespace(proc=WorkerProc(p)) for s, p in enumerate(procs)},
        error_files={},
    )
    result = None
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            result = live.poll(group, pcontext)
            if result.state != WorkerState.HEALTHY:
                break
            if on_poll is not None:
                on_poll(said)
            time.sleep(poll_s)
    finally:
        failed = result is not None and result.state == WorkerState.FAILED
        for p in procs:
            if p.exitcode is None and failed:
                p.join(timeout=leave_s)
                if p.exitcode is None:
                    p.kill()
            p.join(timeout=60)
    codes = {s: p.exitcode for s, p in enumerate(procs)}
    entries = live.entries_due(final=True)  # the store still up, as the agent's is
    return LiveRun(result, said, entries, codes, live.status().to_dict())


def read_records(out: Path, slots: int, key: str) -> list[dict[str, Any]]:
    """Every record of ``<out>/<slot>.jsonl`` for the first ``slots`` slots, each with
    its slot under ``key``."""
    recs = []
    for s in range(slots):
        path = out / f"{s}.jsonl"
        if path.exists():
            recs += [dict(json.loads(line), **{key: s}) for line in path.read_text().splitlines()]
    return recs
