"""When each test ran, on which xdist worker: the parallel run's tail, measured.

With ``RANKGUARD_TEST_TIMELINE=<dir>`` set, every pytest process of the run (each xdist
worker, or pytest alone) appends one JSON line per test to ``<dir>/<worker>.jsonl``
(``tests/conftest.py``): the test's node id, its start and end (``time.time()``), its
outcome and its CPU seconds. Where the worker can have a cgroup of its own (cgroup v1's
``cpuacct`` on a hierarchy of its own, or cgroup v2 without the ``cpu`` controller among
its parent's: neither changes how the CPU is shared; as root, as in CI), every process it
starts is counted, however it ends: a launcher, its ranks, and the processes a fork server
forks (``--preload``'s, whose fork server the launcher leaves to exit by itself, and
``run_ranks``' in the worker), and a Slurm job's (the test cluster's slurmd is started
by the worker: ``tests/slurm_cluster.py``). Elsewhere ``os.times()``: the worker's own
user and system time and that of the children it reaped during the test (a launcher and
the ranks it reaped; not what a fork server forks, nor a Slurm job's). Each
line says which (``"clock"``: ``"cgroup"`` or ``"times"``).
``.ci/run`` sets it and prints the summary after the tests:

    python -m tests.timeline <dir> [--top N] [--by-file]

The summary says when each worker started its first test and ended its last (seconds
from the first test's start), the busy share of each, how long the run's end waited on
the last worker alone, the tests that ran in that tail, and the tests that cost the most
CPU (``--top N`` of them: 15 unless told). ``--by-file`` adds the CPU summed by tier
(``tests/e2e``, ``tests/bench``, ``tests/unit``, ...) and by test file, costliest first:
where to look for a cut.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ENV = "RANKGUARD_TEST_TIMELINE"
CGROUP_PREFIX = "rankguard-timeline-"
MAX_LINE = 4096  # a line longer than this (a corrupt file) is skipped


def cpu_seconds() -> float:
    """User and system CPU of this process and of the children it has reaped."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CgroupClock:
    """The CPU seconds of every process in a cgroup made for one process (and whatever it
    starts, which is born there): made by :func:`cgroup_clock`; :meth:`close` moves
    those left back to the cgroup they came from and removes it."""

    def __init__(self, own: Path, home: Path, usage: str, scale: float) -> None:
        self.own, self.home, self._usage, self._scale = own, home, own / usage, scale

    def __call__(self) -> float:
        text = self._usage.read_text()
        if self._usage.name == "cpu.stat":  # cgroup v2: "usage_usec N" among others
            text = next(ln for ln in text.splitlines() if ln.startswith("usage_usec ")).split()[1]
        return int(text) * self._scale

    def close(self) -> None:
        try:
            for pid in (self.own / "cgroup.procs").read_text().split():
                (self.home / "cgroup.procs").write_text(pid)
            self.own.rmdir()
        except OSError:
            pass


def _remove_left(home: Path) -> None:
    """The cgroups of workers that ended without removing theirs (killed): each empty
    (its processes gone), and only where its process is gone too (a live one may not
    have moved in yet)."""
    for left in home.glob(f"{CGROUP_PREFIX}*"):
        try:
            os.kill(int(left.name[len(CGROUP_PREFIX) :]), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                left.rmdir()  # refused while a process is in it
        except (ValueError, OSError):
            pass


def cgroup_clock(pid: int) -> CgroupClock | None:
    """Move ``pid`` (and its threads) into a new cgroup under its own, in a hierarchy
    that counts CPU without sharing it out: cgroup v1's ``cpuacct`` mounted without
    ``cpu``, or cgroup v2 where the ``cpu`` controller is not enabled for the new one.
    None where there is none such, or it cannot be made (not root)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        groups = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, point = fields[3], fields[4]
        fstype, _, super_opts = line.split(" - ", 1)[1].split()[:3]
        if fstype == "cgroup":
            opts = super_opts.split(",")
            if "cpuacct" not in opts or "cpu" in opts:
                continue
            key, usage, scale = "cpuacct", "cpuacct.usage", 1e-9
        elif fstype == "cgroup2":
            key, usage, scale = "", "cpu.stat", 1e-6
        else:
            continue
        for group in groups:
            _, controllers, path = group.split(":", 2)
            if controllers.split(",") != [key]:  # "cpuacct" alone; "" in cgroup v2
                continue
            rel = os.path.relpath(path, root) if path.startswith(root) else None
            if rel is None or rel.startswith(".."):
                continue
            home = Path(point) / rel
            try:
                if fstype == "cgroup2":
                    enabled = (home / "cgroup.subtree_control").read_text().split()
                    if "cpu" in enabled:
                        continue
                _remove_left(home)
                own = home / f"{CGROUP_PREFIX}{pid}"
                own.mkdir()
            except OSError:
                continue
            clock = CgroupClock(own, home, usage, scale)
            try:
                (own / "cgroup.procs").write_text(str(pid))
                clock()
            except (OSError, ValueError, StopIteration):
                clock.close()
                continue
            return clock
    return None


class Recorder:
    """A pytest plugin: one worker's lines, each appended with one write."""

    def __init__(self, directory: str, clock: CgroupClock | None = None) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / f"{worker}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.worker = worker
        self._start: dict[str, tuple[float, float]] = {}
        self._failed: set[str] = set()
        self._cgroup = clock
        self._clock = clock or cpu_seconds
        self._clock_name = "cgroup" if clock else "times"

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._start[nodeid] = (time.time(), self._clock())

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self._failed.add(report.nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        start = self._start.pop(nodeid, None)
        if start is None:
            return
        t0, c0 = start
        outcome = "failed" if nodeid in self._failed else "ok"
        cpu = round(self._clock() - c0, 3)
        line = {"w": self.worker, "id": nodeid, "t0": t0, "t1": time.time(), "o": outcome}
        line["cpu"] = cpu
        line["clock"] = self._clock_name
        os.write(self._fd, (json.dumps(line) + "\n").encode())

    def pytest_unconfigure(self) -> None:
        os.close(self._fd)
        if self._cgroup is not None:
            self._cgroup.close()


def read(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        for raw in path.read_bytes().splitlines():
            if not raw.strip() or len(raw) > MAX_LINE:
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if (
                isinstance(row, dict)
                and isinstance(row.get("w"), str)
                and isinstance(row.get("id"), str)
                and isinstance(row.get("t0"), (int, float))
                and isinstance(row.get("t1"), (int, float))
            ):
                rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]], tail_tests: int = 10, top_cpu: int = 15) -> list[str]:
    """The lines ``.ci/run`` prints: each worker's span and busy share, the tail, the
    tests that cost the most CPU."""
    if not rows:
        return ["timeline: no test recorded"]
    origin = min(r["t0"] for r in rows)
    workers: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        workers.setdefault(r["w"], []).append(r)
    lines = []
    ends = []
    for name in sorted(workers, key=lambda w: (len(w), w)):
        mine = workers[name]
        first = min(r["t0"] for r in mine) - origin
        last = max(r["t1"] for r in mine) - origin
        busy = sum(r["t1"] - r["t0"] for r in mine)
        ends.append(last)
        lines.append(
            f"timeline: {name}: {len(mine)} tests, {first:.0f} s -> {last:.0f} s, "
            f"busy {busy:.0f} s ({busy / max(last - first, 1e-9):.0%})"
        )
    ends.sort()
    end = ends[-1]
    second = ends[-2] if len(ends) > 1 else end
    lines.append(
        f"timeline: the last worker ended {end:.0f} s after the first test, "
        f"{end - second:.0f} s after the next-to-last"
    )
    if len(ends) > 1 and end - second >= 1.0:
        tail = [r for r in rows if r["t1"] - origin > second]
        tail.sort(key=lambda r: -(r["t1"] - max(r["t0"], second + origin)))
        for r in tail[:tail_tests]:
            lines.append(
                f"timeline:   in the tail: {r['id']} ({r['w']}, {r['t0'] - origin:.0f} s -> "
                f"{r['t1'] - origin:.0f} s)"
            )
    costed = [r for r in rows if isinstance(r.get("cpu"), (int, float))]
    if costed and top_cpu:
        total = sum(r["cpu"] for r in costed)
        clocks = sorted({str(r.get("clock", "times")) for r in costed})
        lines.append(
            f"timeline: CPU recorded: {total:.0f} s over {len(costed)} tests ({', '.join(clocks)})"
        )
        for r in sorted(costed, key=lambda r: -r["cpu"])[:top_cpu]:
            lines.append(
                f"timeline:   CPU {r['cpu']:.1f} s, wall {r['t1'] - r['t0']:.0f} s: {r['id']}"
            )
    return lines


def by_file(rows: list[dict[str, Any]], top: int = 40) -> list[str]:
    """The CPU recorded summed by tier (the node id's first two path parts:
    ``tests/e2e``) and by test file, costliest first (the ``top`` costliest files)."""
    tiers: dict[str, list[float]] = {}
    files: dict[str, list[float]] = {}
    for r in rows:
        if not isinstance(r.get("cpu"), (int, float)):
            continue
        path = str(r["id"]).split("::", 1)[0]
        tier = "/".join(path.split("/")[:2])
        for key, sums in ((tier, tiers), (path, files)):
            sums.setdefault(key, []).append(float(r["cpu"]))
    lines = []
    for label, sums, limit in (("tier", tiers, len(tiers)), ("file", files, top)):
        for key, cpus in sorted(sums.items(), key=lambda kv: -sum(kv[1]))[:limit]:
            lines.append(f"timeline: {label} {key}: CPU {sum(cpus):.1f} s over {len(cpus)} tests")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m tests.timeline <dir> [--top N] [--by-file]"
    top, files = 15, False
    try:
        if "--by-file" in args:
            args.remove("--by-file")
            files = True
        if "--top" in args:
            at = args.index("--top")
            top = int(args[at + 1])
            del args[at : at + 2]
    except (IndexError, ValueError):
        top = -1
    if len(args) != 1 or top < 0:
        print(usage, file=sys.stderr)
        return 2
    directory = Path(args[0])
    if not directory.is_dir():
        print(f"timeline: {directory} is not a directory", file=sys.stderr)
        return 2
    rows = read(directory)
    for line in summary(rows, top_cpu=top):
        print(line)
    if files:
        for line in by_file(rows):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
