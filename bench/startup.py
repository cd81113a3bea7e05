"""Start-up cost of one job: the CPU and wall of every process a launch starts, and the
time from launch to the first step, rankguard next to plain torchrun on the same job.

What: the demo (``rankguard.demo.train``, ``--nproc`` CPU ranks, gloo, ``--steps``
steps) under ``rankguard run --standalone`` and under ``python -m torch.distributed.run
--standalone`` (torchrun), ``--repeats`` runs each, alternated. For each process the
launch starts (launcher, ranks, each rank's process-group guard, any helper interpreter,
py-spy, a fork server) its user+sys CPU and its wall; the total CPU of the launch; and
launch -> the first ``[demo] step 1/`` line (rank 0 prints it, flushed).

How: this process becomes a child subreaper (orphans come back to it) and a thread walks
its descendants every ``--interval`` s through ``/proc/PID/task/TID/children``, keeping
each process's last ``utime+stime`` from ``/proc/PID/stat`` (a process keeps it until it
is reaped). The launch's total is the exact ``RUSAGE_CHILDREN`` delta (every descendant
is reaped by its parent or by this process); what the walk did not see (a process that
lived less than one interval) is listed as ``unseen``.

Imports: the CPU (``time.process_time``) of rankguard's imports on top of torch's in
fresh interpreters (the launcher's ``rankguard.launcher.run`` after torch elastic's
modules torchrun's launcher imports too; the rank's ``rankguard.launcher.worker`` after
torch), and with ``--imports`` one run of each launcher with ``-X importtime`` in the
launcher and (through ``PYTHON_EXEC``, which both launchers use to start a rank) in every
rank: per process, the import time (wall, so inflated by load) spent in torch, in torch
modules that rankguard's modules import, in rankguard's own, in the user's script and in
the rest.

Run: ``python bench/startup.py [--repeats 3] [--imports]``; ``--smoke``: one rankguard
run, 1 rank, 2 steps, and rankguard's import CPU in one interpreter each (the two
interpreters side by side, after the run). Figures are CPU seconds of this machine and
wall seconds that grow with its load (``os.getloadavg``, printed with each run).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_STEP1 = re.compile(r"\[demo\] step 1/")


@dataclass
class Proc:
    pid: int
    start: float  # seconds since boot
    argv: list[str] = field(default_factory=list)
    rank: str = ""
    cpu: float = 0.0  # user + sys seconds, last seen
    last: float = 0.0  # seconds since boot, last seen alive

    @property
    def wall(self) -> float:
        return max(0.0, self.last - self.start)


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                out.extend(int(x) for x in text.split())
    return out


class ProcWatch:
    """Every descendant of this process, sampled every ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.procs: dict[tuple[int, float], Proc] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ProcWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        todo = _children(os.getpid())
        now = _uptime()
        while todo:
            pid = todo.pop()
            todo.extend(_children(pid))
            self._read(pid, now)

    def _read(self, pid: int, now: float) -> None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        start = int(fields[19]) / _TICK
        proc = self.procs.setdefault((pid, start), Proc(pid, start))
        proc.cpu, proc.last = cpu, now
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            argv = [a.decode(errors="replace") for a in argv if a]
            if argv and argv != proc.argv:  # empty once a zombie; changes at an exec
                proc.argv = argv
                proc.rank = _rank_of(pid)

    def reaped(self, pid: int, cpu: float) -> None:
        """An orphan this process reaped: its exact CPU from ``wait4``."""
        for proc in self.procs.values():
            if proc.pid == pid:
                proc.cpu = max(proc.cpu, cpu)


def _rank_of(pid: int) -> str:
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"RANK="):
                return item[5:].decode()
    return ""


def role(proc: Proc) -> str:
    """What a process is, from its command line."""
    argv, text = proc.argv, " ".join(proc.argv)
    if not argv:
        return "unknown (ended before its command line was read)"
    if "torch.distributed.run" in text or "rankguard.cli.main run" in text:
        return "launcher (+ torch elastic agent)"
    if "-c import ctypes, os, signal" in text:
        return "rank's process-group guard (python -S -I -c)"
    if "forkserver" in text:
        return "fork server"
    if proc.rank and ("rankguard.launcher.worker" in text or "rankguard.demo.train" in text):
        return f"rank {proc.rank}"
    exe = os.path.basename(argv[0])
    if exe.startswith("python") and "-c" in argv:
        return f"helper interpreter: {exe} -c {argv[argv.index('-c') + 1][:30]!r}"
    return f"other: {exe} {' '.join(argv[1:3])}"[:60]


def _subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap(watch: ProcWatch) -> None:
    while True:
        try:
            pid, _, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        watch.reaped(pid, ru.ru_utime + ru.ru_stime)


@dataclass
class Run:
    launcher: str
    rc: int
    wall: float
    first_step: float | None
    cpu_total: float
    load: float
    procs: list[Proc]
    tail: list[str]


def command(launcher: str, nproc: int, steps: int, log_dir: Path) -> list[str]:
    job = ["-m", "rankguard.demo.train", "--steps", str(steps)]
    size = ["--nproc-per-node", str(nproc)]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", *size, *job]
    rankguard = [sys.executable, "-m", "rankguard.cli.main", "run", "--standalone"]
    return [*rankguard, *size, "--log-dir", str(log_dir), *job]


def run_once(
    launcher: str, args: argparse.Namespace, *, extra_env: dict[str, str] | None = None
) -> Run:
    log_dir = Path(tempfile.mkdtemp(prefix="rg-startup-"))
    env = {**os.environ, **(extra_env or {})}
    cmd = command(launcher, args.nproc, args.steps, log_dir)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines: list[tuple[float, str]] = []
    with ProcWatch(args.interval) as watch:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip()))
        rc = proc.wait()
        wall = time.monotonic() - t0
        time.sleep(0.2)  # a rank's guard outlives it by a moment
        watch.sample()
        _reap(watch)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(log_dir, ignore_errors=True)
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    first = next((t for t, text in lines if _STEP1.search(text)), None)
    procs = sorted(watch.procs.values(), key=lambda p: p.start)
    return Run(launcher, rc, wall, first, total, load, procs, [t for _, t in lines[-15:]])


def _table(runs: list[Run]) -> list[str]:
    """Per role: processes per run, median CPU and wall per process (over runs)."""
    out = []
    for launcher in dict.fromkeys(r.launcher for r in runs):
        mine = [r for r in runs if r.launcher == launcher]
        roles: dict[str, list[Proc]] = {}
        for r in mine:
            for p in r.procs:
                roles.setdefault(role(p), []).append(p)
        out.append(f"{launcher} ({len(mine)} run(s)):")
        out.append(f"  {'process':<52} {'n/run':>5} {'CPU s':>7} {'wall s':>7}")
        for name, ps in roles.items():
            n = len(ps) / len(mine)
            cpu = statistics.median(p.cpu for p in ps)
            wall = statistics.median(p.wall for p in ps)
            out.append(f"  {name:<52} {n:>5.1f} {cpu:>7.2f} {wall:>7.2f}")
        for r in mine:
            seen = sum(p.cpu for p in r.procs)
            step = "-" if r.first_step is None else f"{r.first_step:.2f}"
            out.append(
                f"  run: exit {r.rc}, load {r.load:.1f}, CPU {r.cpu_total:.2f} s "
                f"(unseen {max(0.0, r.cpu_total - seen):.2f}), wall {r.wall:.2f} s, "
                f"launch -> first step {step} s"
            )
        firsts = [r.first_step for r in mine if r.first_step is not None]
        med_step = f"{statistics.median(firsts):.2f}" if firsts else "-"
        out.append(
            f"  median: CPU {statistics.median(r.cpu_total for r in mine):.2f} s, "
            f"launch -> first step {med_step} s"
        )
    return out


# -- imports ---------------------------------------------------------------------------


def import_rows(text: str) -> list[tuple[int, str, int]]:
    """``-X importtime`` lines: (depth, module, self microseconds), in print order."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line[len("import time:") :].split("|", 2)
        depth = (len(name) - len(name.lstrip(" "))) // 2
        rows.append((depth, name.strip(), int(self_us)))
    return rows


def attribute(rows: list[tuple[int, str, int]], script: str) -> dict[str, float]:
    """Import self time (s) by who asked for it: torch (``torch`` itself, numpy, and what
    they import), torch modules a rankguard module imports (listed by module), rankguard's
    own modules, the user's script (``script``: its package prefix), the rest."""
    parts: dict[str, float] = {}
    pulled: dict[str, float] = {}
    stack: list[tuple[int, str]] = []
    for depth, name, us in reversed(rows):  # a parent prints after its children
        while stack and stack[-1][0] >= depth:
            stack.pop()
        chain = [n for _, n in stack] + [name]
        top = chain[0]
        torchy = [n for n in chain if n == "torch" or n.startswith(("torch.", "numpy"))]
        if top.startswith(script):
            who = "the script"
        elif top.startswith("rankguard") and torchy and "torch" not in chain:
            who = "torch modules rankguard imports"
            pulled[torchy[0]] = pulled.get(torchy[0], 0.0) + us / 1e6
        elif torchy:
            who = "torch"
        elif top.startswith("rankguard"):
            who = "rankguard"
        else:
            who = "interpreter and other"
        parts[who] = parts.get(who, 0.0) + us / 1e6
        stack.append((depth, name))
    for mod, s in sorted(pulled.items(), key=lambda kv: -kv[1])[:4]:
        parts[f"  of which {mod}"] = s
    return parts


# What each launcher's process imports before rankguard's: torch and torch elastic's
# parts that torchrun's launcher (and a rank's ``record``) import too.
_BASE = {
    "launcher": "import torch, torch.distributed.run, torch.distributed.elastic.multiprocessing",
    "rank": "import torch, torch.distributed.elastic.multiprocessing.errors",
}
_OURS = {
    "launcher": "import rankguard.cli.main, rankguard.launcher.run",
    "rank": "import rankguard.launcher.worker",
}


def import_cpu(runs: int, *, torch_alone: bool = True, side_by_side: bool = False) -> list[str]:
    """CPU (``time.process_time``) of rankguard's imports on top of torch's, median of
    ``runs`` fresh interpreters, and of ``import torch`` alone. ``side_by_side`` (the
    smoke run): every interpreter at once, not one after the other."""
    out = ["import CPU (median of fresh interpreters, ms):"]
    cases = [("torch", "", "import torch")] if torch_alone else []
    cases += [(f"rankguard's, {k}", _BASE[k], _OURS[k]) for k in _BASE]

    def start(pre: str, mod: str) -> subprocess.Popen[str]:
        code = f"import time\n{pre}\nt = time.process_time()\n{mod}\n"
        code += "print(time.process_time() - t)"
        return subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    def cpu_of(proc: subprocess.Popen[str]) -> float | None:
        stdout, _ = proc.communicate()
        with contextlib.suppress(ValueError, IndexError):
            return float(stdout.split()[-1])
        return None

    started = (
        {label: [start(pre, mod) for _ in range(runs)] for label, pre, mod in cases}
        if side_by_side
        else {}
    )
    for label, pre, mod in cases:
        if side_by_side:
            seconds = [cpu_of(proc) for proc in started[label]]
        else:
            seconds = [cpu_of(start(pre, mod)) for _ in range(runs)]
        got = [x for x in seconds if x is not None]
        med = f"{statistics.median(got) * 1000:.0f}" if got else "failed"
        out.append(f"  {label}: {med}")
    return out


def measure_imports(launcher: str, args: argparse.Namespace) -> list[str]:
    tmp = Path(tempfile.mkdtemp(prefix="rg-imports-"))
    wrapper = tmp / "python"
    wrapper.write_text(
        f'#!/bin/sh\nexec {sys.executable} -X importtime "$@" 2>"{tmp}/rank.$$.txt"\n'
    )
    wrapper.chmod(0o755)
    log_dir = tmp / "logs"
    cmd = command(launcher, args.nproc, args.steps, log_dir)
    cmd.insert(1, "-X")
    cmd.insert(2, "importtime")
    with (tmp / "launcher.txt").open("w") as err:
        rc = subprocess.run(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHON_EXEC": str(wrapper)},
            timeout=args.timeout,
        ).returncode
    out = [f"{launcher} -X importtime (exit {rc}), wall s of import (self, summed):"]
    for path in sorted(tmp.glob("*.txt")):
        parts = attribute(import_rows(path.read_text(errors="replace")), "rankguard.demo")
        name = "launcher" if path.name == "launcher.txt" else "rank"
        total = sum(v for k, v in parts.items() if not k.startswith(" "))
        detail = ", ".join(f"{k.strip()} {v:.2f}" for k, v in parts.items())
        out.append(f"  {name}: {total:.2f} ({detail})")
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs per launcher")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--interval", type=float, default=0.02, help="process walk period (s)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--launchers", default="torchrun,rankguard")
    p.add_argument("--imports", action="store_true", help="also -X importtime per process")
    p.add_argument("--smoke", action="store_true", help="one rankguard run, 1 rank, 2 steps")
    args = p.parse_args(argv)
    if args.smoke:
        args.repeats, args.nproc, args.steps, args.launchers = 1, 1, 2, "rankguard"
    _subreaper()
    launchers = args.launchers.split(",")
    runs: list[Run] = []
    for i in range(args.repeats):
        for launcher in launchers:
            run = run_once(launcher, args)
            runs.append(run)
            print(
                f"[{i + 1}/{args.repeats}] {launcher}: exit {run.rc}, CPU {run.cpu_total:.2f} s,"
                f" first step {run.first_step} s, load {run.load:.1f}",
                flush=True,
            )
            if run.rc != 0 or run.first_step is None:
                print("\n".join(run.tail))
    print("\n".join(_table(runs)))
    imports = import_cpu(
        1 if args.smoke else 7, torch_alone=not args.smoke, side_by_side=args.smoke
    )
    print("\n".join(imports))
    if args.imports:
        for launcher in launchers:
            print("\n".join(measure_imports(launcher, args)))
    return 0 if all(r.rc == 0 and r.first_step is not None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
