"""Restart or stop: a labelled set of failures through the launcher's decision code.

What: each case is one kind of failure a training job meets, labelled ``deterministic``
(it fails the same way at every start: an import, a syntax error, a missing data file, a
shape mismatch, a bad argument or configuration; or the same exception at the same
step) or ``transient`` (a SIGKILL, an OOM kill, a hang, a lost peer or store, NaN, a
GPU's XID, NCCL, CUDA and network errors). Goal: every deterministic failure stopped
after one attempt (the same exception at the same step: at its first repeat, the
earliest it can be known), no transient one ever stopped, the verdict within 1 s of
the last rank's exit.

How (no launch per case): every failure is made for real where this machine can make
it, in this process: the case's ``train.py`` (and the modules it imports) is written to
a directory and run with ``runpy``; the exception it raises (``ModuleNotFoundError``,
``SyntaxError``, torch's own shape errors, argparse's exit 2, a gloo collective whose
peer went away, a TCPStore that is not there, a reset socket, ...) goes into torch
elastic's error file through torch's own ``ErrorHandler.record_exception`` (what
``@record`` writes), and the rank's last heartbeat record (before the first step, or at
the iteration it failed) into the run directory. A signal (SIGKILL, SIGSEGV, ...) is the
worker's exit code, as torch elastic reports it; a hang, a GPU health failure or a NaN
is the finding the launcher acted on (``RankguardAgent.set_cause``) or the rerun state
machine's exit code. CUDA, NCCL and ECC errors cannot happen on a CPU: their cases raise
the exception types torch raises with the messages they print (said in the table).

Each attempt goes through the real ``RankguardAgent._monitor_workers`` (its poll of the
workers is the only thing replaced, by a subclass that reports the attempt's failure):
the root cause, the fingerprint from the files, the decision, the stop line. A case
runs up to ``ATTEMPTS`` attempts while the decision is restart, each failing the same
way at the same iteration (the worst case for a transient failure: no progress at all,
so the no-progress rule is exercised too). The verdict time is the agent's monitoring
step that decides (reading the error file and the heartbeat records included), timed
with ``time.perf_counter``; a real launch adds at most one poll interval
(``monitor_interval_s``, 0.1 s) after the last rank's exit.

Run: ``python bench/restart_or_stop.py`` (a few seconds); ``--smoke``: one case of each
label.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # torch's own lines of the errors made

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

from rankguard.ft.decide import RestartDecider
from rankguard.ft.policy import RestartPolicy
from rankguard.launcher.agent import RankguardAgent
from rankguard.schema.exits import EXIT_RERUN_RESUME
from rankguard.schema.findings import FindingType

ATTEMPTS = 4  # attempts while the decision is restart (3 without progress: the rule's default)
MAX_RESTARTS = 5
NPROC = 2
FAULT_RANK = 1
PIDS = {0: 41000, 1: 41001}
DETERMINISTIC, TRANSIENT = "deterministic", "transient"


@dataclass(frozen=True)
class Case:
    """One failure: ``script`` the user's ``train.py`` (it raises; ``STEP`` is the
    iteration), ``files`` more modules beside it, ``iteration`` where it fails (None:
    before the first step), ``exit_code`` the worker's exit when no exception escapes
    (negative: a signal), ``finding`` the finding the launcher acted on (a kill),
    ``stop_at`` the attempt it should stop after (None: never)."""

    name: str
    label: str
    kind: str
    script: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    iteration: int | None = None
    exit_code: int = 1
    finding: str | None = None
    note: str = ""
    stop_at: int | None = None
    text_only: bool = False  # the exception a GPU would raise, with its message (no GPU)

    @property
    def made(self) -> str:
        """How the failure was made: ``raised`` (for real), ``text`` (a GPU's message),
        ``exit`` (the worker's exit code or signal), ``finding`` (and the finding)."""
        if self.script is not None:
            return "text" if self.text_only else "raised"
        return "exit+finding" if self.finding else "exit"


def _det(name: str, kind: str, script: str, **kw: Any) -> Case:
    return Case(name, DETERMINISTIC, kind, script, stop_at=1, **kw)


def _repeat(name: str, script: str, iteration: int, **kw: Any) -> Case:
    return Case(
        name,
        DETERMINISTIC,
        "same exception at the same step",
        script,
        iteration=iteration,
        stop_at=2,
        **kw,
    )


def _tr(name: str, kind: str, script: str | None = None, **kw: Any) -> Case:
    return Case(name, TRANSIENT, kind, script, **kw)


_LOST_PEER = """
import datetime, threading, torch, torch.distributed as dist
store, groups = dist.HashStore(), {}
def join(r):
    groups[r] = dist.ProcessGroupGloo(dist.PrefixStore("pg", store), r, 2,
                                      datetime.timedelta(seconds=2))
threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
[t.start() for t in threads]; [t.join() for t in threads]
del groups[1]  # the peer's process is gone: its sockets close
groups[0].allreduce([torch.ones(4)]).wait()
"""
_NO_STORE = """
import datetime, socket, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=0.3))
"""
_STORE_TIMEOUT = """
import datetime, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=0.2))
store.get("rendezvous/round_7/last_participant")
"""
_RESET = """
import socket, struct
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
peer.close()  # an RST: the peer's host went away
client.recv(1)
"""
_BROKEN_PIPE = """
import os
r, w = os.pipe(); os.close(r)
os.write(w, b"batch")  # the data loader's worker is gone
"""
_SOCKET_TIMEOUT = """
import socket
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
client = socket.create_connection(server.getsockname(), timeout=0.05)
client.recv(1)  # the parameter server never answers
"""

CASES: list[Case] = [
    # ---- deterministic, before the first step ------------------------------------------
    _det("missing module", "import", "import flash_attn_not_installed\n"),
    _det("missing name", "import", "from os import makedirs_exist_ok\n"),
    _det(
        "broken helper import",
        "import",
        "import helper\n",
        files={"helper.py": "from collections import OrderedDictionary\n"},
    ),
    _det("syntax error", "syntax", "def train(:\n    pass\n"),
    _det(
        "syntax error in a module",
        "syntax",
        "import model\n",
        files={"model.py": "class Net:\n    def forward(self x):\n        return x\n"},
    ),
    _det("indentation", "syntax", "def train():\nreturn 1\n"),
    _det("undefined name", "syntax", "model = build_model(cfg)\n"),
    _det("missing data file", "missing file", "open('/data/shards/train-00000.bin', 'rb')\n"),
    _det(
        "missing checkpoint",
        "missing file",
        "import torch\ntorch.load('/ckpt/run7/step_1000/model.pt')\n",
    ),
    _det("data path is a directory", "missing file", "open(__import__('tempfile').gettempdir())\n"),
    _det("path through a file", "missing file", "import os\nos.listdir(__file__ + '/shards')\n"),
    _det(
        "matmul shapes",
        "shape mismatch",
        "import torch\ntorch.randn(8, 512) @ torch.randn(768, 512)\n",
    ),
    _det(
        "linear input size",
        "shape mismatch",
        "import torch\ntorch.nn.Linear(1024, 10)(torch.randn(4, 768))\n",
    ),
    _det("view", "shape mismatch", "import torch\ntorch.randn(6, 5).view(4, 8)\n"),
    _det("broadcast", "shape mismatch", "import torch\ntorch.randn(4, 3) + torch.randn(4, 5)\n"),
    _det(
        "state dict size",
        "shape mismatch",
        "import torch\nnet = torch.nn.Linear(8, 4)\n"
        "net.load_state_dict(torch.nn.Linear(8, 5).state_dict())\n",
    ),
    _det(
        "concatenation",
        "shape mismatch",
        "import torch\ntorch.cat([torch.randn(2, 3), torch.randn(2, 4)], dim=0)\n",
    ),
    _det(
        "embedding index",
        "shape mismatch",
        "import torch\ntorch.nn.Embedding(100, 8)(torch.tensor([5, 120]))\n",
    ),
    _det(
        "unknown option",
        "bad argument",
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', type=float)\n"
        "p.parse_args(['--learning-rate', '3e-4'])\n",
    ),
    _det(
        "bad option value",
        "bad argument",
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--batch', type=int)\n"
        "p.parse_args(['--batch', '32x'])\n",
    ),
    _det(
        "bad keyword",
        "bad argument",
        "import torch\ntorch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), learning_rate=1)\n",
    ),
    _det("config value", "configuration", "lr = float('3e-4,')\n"),
    _det(
        "config key", "configuration", "cfg = {'model': {'dim': 512}}\ncfg['model']['n_layers']\n"
    ),
    _det(
        "config attribute",
        "configuration",
        "import types\ncfg = types.SimpleNamespace(dim=512)\ncfg.num_heads\n",
    ),
    _det(
        "config check",
        "configuration",
        "world, batch = 8, 12\nif batch % world:\n"
        "    raise ValueError(f'global batch {batch} is not a multiple of {world} ranks')\n",
    ),
    _det("config file JSON", "configuration", "import json\njson.loads('{\"lr\": 3e-4,}')\n"),
    _det("config file YAML", "configuration", "import yaml\nyaml.safe_load('model: [dim: 512')\n"),
    # ---- deterministic: the same exception at the same step ----------------------------
    _repeat("division by zero", "tokens = 0\nloss_per_token = 12.5 / tokens\n", 57),
    _repeat("user assertion", "loss = float('inf')\nassert loss < 1e4, f'loss {loss}'\n", 12),
    _repeat("dataset index", "samples = list(range(100))\nsamples[STEP * 4]\n", 200),
    _repeat("ragged last batch", "import torch\ntorch.randn(3, 16) @ torch.randn(32, 16)\n", 80),
    _repeat("sample key", "sample = {'input_ids': [1, 2]}\nsample['labels']\n", 30),
    _repeat(
        "custom data error",
        "class CorruptShardError(Exception):\n    pass\n"
        "raise CorruptShardError(f'shard 17: checksum mismatch at record {STEP * 64}')\n",
        99,
    ),
    _repeat("bad sample value", "int('n/a')\n", 40),
    _repeat("shard missing mid-epoch", "open(f'/data/shards/train-{STEP // 100:05d}.bin')\n", 1000),
    _repeat("NaN check of the script", "raise RuntimeError(f'loss is NaN at step {STEP}')\n", 500),
    # ---- transient -----------------------------------------------------------------------
    _tr("SIGKILL", "killed", iteration=50, exit_code=-9),
    _tr("SIGKILL before the first step", "killed", exit_code=-9),
    _tr(
        "OOM kill",
        "OOM kill",
        iteration=120,
        exit_code=-9,
        finding=FindingType.PROCESS_EXITED.value,
        note="Out of memory: Killed process",
    ),
    _tr("segfault", "killed", iteration=33, exit_code=-11),
    _tr("bus error", "killed", iteration=33, exit_code=-7),
    _tr("abort", "killed", iteration=70, exit_code=-6),
    _tr("SIGTERM", "killed", iteration=70, exit_code=-15),
    _tr(
        "hang (no progress)",
        "hang",
        iteration=64,
        exit_code=-9,
        finding=FindingType.PROGRESS_TIMEOUT.value,
    ),
    _tr(
        "hang (stopped process)",
        "hang",
        iteration=64,
        exit_code=-9,
        finding=FindingType.PROCESS_TIMEOUT.value,
    ),
    _tr(
        "hang (section timeout)",
        "hang",
        iteration=64,
        exit_code=-15,
        finding=FindingType.SECTION_TIMEOUT.value,
    ),
    _tr(
        "hang (D state)",
        "hang",
        iteration=64,
        exit_code=-9,
        finding=FindingType.UNINTERRUPTIBLE.value,
    ),
    _tr("lost peer (gloo)", "lost peer", _LOST_PEER, iteration=81),
    _tr("lost store", "lost peer", _NO_STORE, iteration=81),
    _tr("store timeout before the first step", "lost peer", _STORE_TIMEOUT),
    _tr("lost store before the first step", "lost peer", _NO_STORE),
    _tr("connection reset", "lost peer", _RESET, iteration=15),
    _tr("broken pipe", "lost peer", _BROKEN_PIPE, iteration=15),
    _tr("socket timeout", "lost peer", _SOCKET_TIMEOUT, iteration=15),
    _tr(
        "NaN rerun",
        "NaN",
        iteration=300,
        exit_code=EXIT_RERUN_RESUME,
        finding=FindingType.RERUN_TRANSIENT_FAULT.value,
    ),
    _tr(
        "fake XID",
        "XID",
        iteration=45,
        exit_code=-15,
        finding=FindingType.HEALTH_FAILURE.value,
        note="XID 79: GPU has fallen off the bus",
    ),
    _tr(
        "node health",
        "XID",
        iteration=45,
        exit_code=-15,
        finding=FindingType.NODE_HEALTH_FAILURE.value,
    ),
    _tr(
        "CUDA error",
        "GPU error",
        "raise RuntimeError('CUDA error: an illegal memory access was encountered')\n",
        iteration=230,
        text_only=True,
    ),
    _tr(
        "ECC error",
        "GPU error",
        "raise RuntimeError('CUDA error: uncorrectable ECC error encountered')\n",
        iteration=230,
        text_only=True,
    ),
    _tr(
        "NCCL error",
        "lost peer",
        "import torch.distributed as dist\nraise dist.DistBackendError("
        "'NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a "
        "network error, NCCL version 2.21.5')\n",
        iteration=230,
        text_only=True,
    ),
]


@dataclass
class Outcome:
    case: Case
    decisions: list[tuple[str, str]] = field(default_factory=list)  # (verdict, rule) each
    times_s: list[float] = field(default_factory=list)  # each verdict's time
    line: str = ""  # the stop line
    fingerprint: str = ""

    @property
    def stopped_at(self) -> int | None:
        verdicts = [v for v, _ in self.decisions]
        return verdicts.index("stop") + 1 if "stop" in verdicts else None

    @property
    def right(self) -> bool:
        return self.stopped_at == self.case.stop_at


# ---- one attempt, made for real ------------------------------------------------------------


def _raise(case: Case, workdir: Path, error_file: Path) -> tuple[int, str | None]:
    """Run the case's ``train.py``; its exception into ``error_file`` as ``@record``
    writes it. The worker's exit code and its error line."""
    for name, text in case.files.items():
        (workdir / name).write_text(text)
    script = workdir / "train.py"
    script.write_text(case.script or "")
    os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    sys.path.insert(0, str(workdir))
    try:
        runpy.run_path(str(script), init_globals={"STEP": case.iteration or 0}, run_name="__main__")
    except SystemExit as exc:  # argparse: usage on stderr, exit 2, no error file
        return (exc.code if isinstance(exc.code, int) else 1), None
    except Exception as exc:
        ErrorHandler().record_exception(exc)
        return 1, f"{type(exc).__name__}: {exc}"
    finally:
        sys.path.remove(str(workdir))
        for name in case.files:
            sys.modules.pop(name.removesuffix(".py"), None)
        os.environ.pop("TORCHELASTIC_ERROR_FILE", None)
    raise AssertionError(f"{case.name}: the script did not fail")


def _heartbeats(run_dir: Path, case: Case, exit_code: int, error: str | None) -> None:
    """Each rank's last record: the failing rank's ``process_end`` after an exception
    (none after a signal), the others still at the same place."""
    now = time.time_ns()
    for rank, pid in PIDS.items():
        it = case.iteration
        rec: dict[str, Any] = {
            "schema_version": 1,
            "event": "heartbeat",
            "run_id": "bench",
            "rank": rank,
            "pid": pid,
            "wall_time_ns": now,
            "progress_seq": it or 0,
            "iteration": it,
            "phase": "train" if it else "setup",
        }
        if rank == FAULT_RANK and exit_code >= 0:
            rec["event"] = "process_end"
            rec["exit"] = {"clean": False, "exit_code": exit_code, "error": error}
        path = run_dir / f"rank_{rank}_pid_{pid}.heartbeat.jsonl"
        with path.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")


class _Group:
    """The worker group the agent watches (its ranks' pids)."""

    state = WorkerState.HEALTHY
    workers = [type("W", (), {"global_rank": r, "id": pid})() for r, pid in PIDS.items()]


class _Polled(LocalElasticAgent):
    """torch elastic's poll of the workers, replaced: the attempt's failure."""

    failure: tuple[int, int, str] | None = None  # (rank, exit code, error file)

    def _monitor_workers(self, worker_group: Any) -> Any:
        assert self.failure is not None
        rank, code, error_file = self.failure
        failed = ProcessFailure(
            local_rank=rank, pid=PIDS[rank], exitcode=code, error_file=error_file
        )
        return RunResult(state=WorkerState.FAILED, failures={rank: failed})

    def _restart_workers(self, worker_group: Any) -> None:
        return None


class _Agent(RankguardAgent, _Polled):
    """rankguard's agent over the replaced poll (its own monitoring step unchanged)."""


def evaluate(case: Case, root: Path) -> Outcome:
    run_dir = root / case.name.replace(" ", "_").replace("(", "").replace(")", "")
    run_dir.mkdir(parents=True)
    lines: list[dict[str, Any]] = []
    policy = RestartPolicy(RestartDecider(), run_dir, "bench", lines.append)
    spec = WorkerSpec(
        role="trainer",
        local_world_size=NPROC,
        entrypoint="python",
        args=(),
        rdzv_handler=object(),
        max_restarts=MAX_RESTARTS,
    )
    agent = _Agent(
        spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs")), restart_policy=policy
    )
    out = Outcome(case)
    group = _Group()
    for attempt in range(1, ATTEMPTS + 1):
        error_file = run_dir / f"error_{attempt}.json"
        workdir = run_dir / f"attempt_{attempt}"
        workdir.mkdir()
        code, error = (case.exit_code, None)
        if case.script is not None:
            code, error = _raise(case, workdir, error_file)
        _heartbeats(run_dir, case, code, error)
        if case.finding is not None:  # the launcher kills the rank for this finding
            agent.set_cause(
                {"finding_type": case.finding, "rank": FAULT_RANK, "message": case.note},
                abort=False,
            )
        agent.failure = (FAULT_RANK, code, str(error_file) if error_file.exists() else "")
        t0 = time.perf_counter()
        agent._monitor_workers(group)
        out.times_s.append(time.perf_counter() - t0)
        decision = policy.last
        assert decision is not None, f"{case.name}: no decision"
        out.decisions.append((decision.verdict.value, decision.rule.value))
        out.fingerprint = decision.fingerprint.describe()
        if decision.stop:
            out.line = decision.line()
            break
        agent._remaining_restarts -= 1  # torch elastic's count, then its restart
        agent._restart_workers(group)
    return out


# ---- the table -----------------------------------------------------------------------------


def report(outcomes: list[Outcome]) -> bool:
    rows = [
        ["label", "kind", "case", "made", "decisions", "want", "ok", "verdict ms", "fingerprint"]
    ]
    for o in outcomes:
        c = o.case
        rows.append(
            [
                c.label,
                c.kind,
                c.name,
                c.made,
                " ".join(f"{v}({r})" if v == "stop" else v for v, r in o.decisions),
                f"stop at {c.stop_at}" if c.stop_at else f"{ATTEMPTS} restarts",
                "ok" if o.right else "WRONG",
                f"{1000 * max(o.times_s):.1f}",
                o.fingerprint[:90],
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=False)) + "  " + r[-1])
    det = [o for o in outcomes if o.case.label == DETERMINISTIC]
    first = [o for o in det if o.case.stop_at == 1]
    repeat = [o for o in det if o.case.stop_at == 2]
    trans = [o for o in outcomes if o.case.label == TRANSIENT]
    times = [t for o in outcomes for t in o.times_s]
    print()
    print(
        f"deterministic stopped after one attempt: {sum(o.right for o in first)}/{len(first)}; "
        f"the same exception at the same step stopped at its first repeat: "
        f"{sum(o.right for o in repeat)}/{len(repeat)}; "
        f"deterministic stopped in all: {sum(o.stopped_at is not None for o in det)}/{len(det)} "
        f"({100 * sum(o.right for o in det) / max(1, len(det)):.0f} % as labelled)"
    )
    print(
        f"transient stopped: {sum(o.stopped_at is not None for o in trans)}/{len(trans)} "
        f"(each failed {ATTEMPTS} times at the same iteration)"
    )
    print(
        f"verdict time (the agent's monitoring step that decides, {len(times)} decisions): "
        f"median {1000 * statistics.median(times):.1f} ms, max {1000 * max(times):.1f} ms"
    )
    stop = next((o.line for o in outcomes if o.line), "")
    print(f"a stop line: {stop}")
    ok = all(o.right for o in outcomes) and max(times) < 1.0
    print(f"goal (100 % / 0 %, verdict < 1 s): {'MET' if ok else 'NOT MET'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="one case of each label")
    args = p.parse_args(argv)
    cases = CASES
    if args.smoke:
        cases = [next(c for c in CASES if c.label == label) for label in (DETERMINISTIC, TRANSIENT)]
    load = os.getloadavg()
    print(
        f"restart-or-stop bench: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.2f}; {len(cases)} cases "
        f"({sum(c.label == DETERMINISTIC for c in cases)} deterministic, "
        f"{sum(c.label == TRANSIENT for c in cases)} transient), {NPROC} ranks, rank "
        f"{FAULT_RANK} failing, --max-restarts {MAX_RESTARTS}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="rg-restart-or-stop-") as tmp:
        outcomes = [evaluate(case, Path(tmp)) for case in cases]
    return 0 if report(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
