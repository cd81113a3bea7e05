"""The test suite's own cost: CPU and wall time per tier, and the launcher jobs and Python
interpreters each test file starts.

    python -m tests.cost                      # every tier, one pytest process each
    python -m tests.cost --tiers e2e --per-file
    python -m tests.cost --tiers bench -- -k soak

Each tier (or, with ``--per-file``, each of its test files) runs as one pytest process,
``python -m pytest -q -p no:cacheprovider <paths>``, one after the other; its CPU is the
user + system time of pytest and every descendant it waited for (``os.wait4``, what
``/usr/bin/time`` reports: the launchers and the ranks they reap; not the ``run_ranks``
processes, children of the forkserver, which nobody waits for). Run it on a quiet
machine: other jobs lengthen the wall times several times and the CPU times a little.

What each test starts is counted as it starts: every Python interpreter the run starts
(pytest's descendants, however deep: bench scripts, launchers, ranks) imports a
``usercustomize`` module this script puts in a user site directory of its own
(``PYTHONUSERBASE``; the real user site stays on ``sys.path``), which appends one line
to a log (the test that was running, from ``PYTEST_CURRENT_TEST``, which children
inherit, and the command line). A launcher job is an interpreter whose command is
``rankguard run`` (the console script, ``-m rankguard.cli.main run``, or a bench's
``*_launcher.py run`` wrapper; a usage error's too) or torchrun (``torchrun`` or ``-m
torch.distributed.run``). Processes forked without a new interpreter (``run_ranks``'s
ranks, ``--preload``'s ranks) are not interpreters started, and one started without the
user site (``-s``, ``-I``, ``PYTHONNOUSERSITE``) is not seen; pytest itself and what starts
outside a test (xdist's workers) count under "(outside a test)".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import site
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {
    "unit": ("1: unit (with the `run_ranks` tests)", ["tests/unit"]),
    "tier2": ("2: ranks as threads", ["tests/tier2"]),
    "e2e": ("3: end to end", ["tests/e2e"]),
    "bench": ("bench smoke runs", ["tests/bench"]),
}
LOG_ENV = "RANKGUARD_TEST_COST_LOG"
USER_SITE_ENV = "RANKGUARD_TEST_COST_USER_SITE"

# Imported by every interpreter the tests start (kept small: it runs before anything
# else in each of them). One line per interpreter, appended in one write.
USERCUSTOMIZE = f'''
import os as _os
import sys as _sys

_site = _os.environ.get("{USER_SITE_ENV}")
if _site and _os.path.isdir(_site):
    import site as _s
    _s.addsitedir(_site)
_log = _os.environ.get("{LOG_ENV}")
if _log:
    try:
        import json as _json
        _line = _json.dumps(
            {{"test": _os.environ.get("PYTEST_CURRENT_TEST", ""), "pid": _os.getpid(),
              "argv": list(getattr(_sys, "orig_argv", _sys.argv))}}
        ) + "\\n"
        _fd = _os.open(_log, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o600)
        try:
            _os.write(_fd, _line.encode())
        finally:
            _os.close(_fd)
    except Exception:
        pass
'''


def launcher_of(argv: list[str]) -> str | None:
    """``rankguard run`` or ``torchrun`` where ``argv`` (an interpreter's original command
    line) starts that launcher, else None."""
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        # interpreter options: -u, -B, -Xdev, -Wignore; -X and -W take the next word
        args = args[2:] if args[0] in ("-X", "-W") else args[1:]
    if not args:
        return None
    if args[0] == "-m" and len(args) > 1:
        module, rest = args[1], args[2:]
    elif args[0] == "-c":
        return None
    else:
        module, rest = Path(args[0]).name, args[1:]
    launcher = module in ("rankguard.cli.main", "rankguard", "rankguard.cli")
    # a bench's wrapper around the launcher (bench/fault_matrix_launcher.py)
    launcher = launcher or module.endswith("_launcher.py")
    if launcher and rest[:1] == ["run"]:
        return "rankguard run"
    if module in ("torch.distributed.run", "torchrun"):
        return "torchrun"
    return None


@dataclass
class FileCount:
    interpreters: int = 0
    launchers: Counter[str] = field(default_factory=Counter)


def count(log: Path) -> dict[str, FileCount]:
    """Per test file: the interpreters started and the launcher jobs among them."""
    files: dict[str, FileCount] = {}
    if not log.exists():
        return files
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
            test, argv = str(rec["test"]), [str(a) for a in rec["argv"]]
        except (ValueError, KeyError, TypeError):
            continue
        name = test.split("::")[0] if test else "(outside a test)"
        entry = files.setdefault(name, FileCount())
        entry.interpreters += 1
        kind = launcher_of(argv)
        if kind:
            entry.launchers[kind] += 1
    return files


@dataclass
class Result:
    label: str
    paths: list[str]
    tests: str
    cpu_s: float
    wall_s: float
    rc: int
    files: dict[str, FileCount]


SUMMARY = re.compile(r"^=*\s*(.*\d+ (passed|failed|skipped|error|errors|deselected).*?)\s*=*$")


def run_pytest(label: str, paths: list[str], extra: list[str], out_dir: Path) -> Result:
    userbase = Path(tempfile.mkdtemp(prefix="userbase-", dir=out_dir))
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    usersite = userbase / "lib" / pyver / "site-packages"
    usersite.mkdir(parents=True)
    (usersite / "usercustomize.py").write_text(USERCUSTOMIZE, encoding="utf-8")
    log = userbase / "interpreters.jsonl"
    env = {
        **os.environ,
        "PYTHONUSERBASE": str(userbase),
        LOG_ENV: str(log),
        USER_SITE_ENV: site.getusersitepackages(),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths, *extra]
    output = out_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", " ".join(paths)) + ".log")
    start = time.monotonic()
    with output.open("w", encoding="utf-8") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    tests = ""
    for line in output.read_text(encoding="utf-8", errors="replace").splitlines():
        m = SUMMARY.match(line.strip())
        if m:
            tests = m.group(1).split(" in ")[0]
    files = count(log)
    return Result(
        label,
        paths,
        tests,
        usage.ru_utime + usage.ru_stime,
        wall,
        proc.returncode,
        files,
    )


def files_under(paths: list[str]) -> list[str]:
    found: list[str] = []
    for p in paths:
        path = ROOT / p
        if path.is_file():
            found.append(p)
        else:
            found += sorted(str(f.relative_to(ROOT)) for f in path.rglob("test_*.py"))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tiers",
        default=",".join(TIERS),
        help="comma-separated, of " + ", ".join(TIERS) + " (default: all)",
    )
    p.add_argument("--per-file", action="store_true", help="one pytest process per file")
    p.add_argument("--keep", default=None, help="a directory for pytest's output and logs")
    p.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = p.parse_args(argv)
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    bad = [t for t in tiers if t not in TIERS]
    if bad:
        p.error(f"--tiers: unknown {', '.join(bad)} (known: {', '.join(TIERS)})")
    out_dir = Path(args.keep or tempfile.mkdtemp(prefix="rg-test-cost-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU(s), "
        f"load average {os.getloadavg()[0]:.2f}; pytest output in {out_dir}",
        flush=True,
    )
    results: list[Result] = []
    for tier in tiers:
        label, paths = TIERS[tier]
        runs = [[f] for f in files_under(paths)] if args.per_file else [paths]
        for run_paths in runs:
            res = run_pytest(label, run_paths, args.pytest_args, out_dir)
            results.append(res)
            jobs = sum(sum(c.launchers.values()) for c in res.files.values())
            print(
                f"  {' '.join(run_paths)}: {res.tests or 'no summary'} (exit {res.rc}), "
                f"CPU {res.cpu_s:.1f} s, wall {res.wall_s:.0f} s, {jobs} launcher job(s)",
                flush=True,
            )
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}\n")
    print("| tier | paths | tests | CPU s | wall s | launcher jobs | interpreters |")
    print("|---|---|---|---|---|---|---|")
    for label, _ in TIERS.values():
        mine = [r for r in results if r.label == label]
        if not mine:
            continue
        paths = sorted({p for r in mine for p in r.paths}) if not args.per_file else []
        where = " ".join(f"`{p}`" for p in paths) or f"{len(mine)} files one by one"
        tests = "; ".join(r.tests for r in mine) if len(mine) == 1 else f"{len(mine)} runs"
        jobs = sum(sum(c.launchers.values()) for r in mine for c in r.files.values())
        interp = sum(c.interpreters for r in mine for c in r.files.values())
        cpu = sum(r.cpu_s for r in mine)
        wall = sum(r.wall_s for r in mine)
        print(f"| {label} | {where} | {tests} | {cpu:.1f} | {wall:.0f} | {jobs} | {interp} |")
    print("\nPer test file (files that started an interpreter):\n")
    print("| file | rankguard run | torchrun | interpreters | CPU s (--per-file) |")
    print("|---|---|---|---|---|")
    per_file_cpu = {r.paths[0]: r.cpu_s for r in results if args.per_file}
    merged: dict[str, FileCount] = {}
    for r in results:
        for name, c in r.files.items():
            entry = merged.setdefault(name, FileCount())
            entry.interpreters += c.interpreters
            entry.launchers.update(c.launchers)
    for name in sorted(merged, key=lambda n: (-sum(merged[n].launchers.values()), n)):
        c = merged[name]
        cpu = f"{per_file_cpu[name]:.1f}" if name in per_file_cpu else ""
        print(
            f"| `{name}` | {c.launchers['rankguard run']} | {c.launchers['torchrun']} "
            f"| {c.interpreters} | {cpu} |"
        )
    total = Counter[str]()
    for c in merged.values():
        total.update(c.launchers)
    print(
        f"\nlauncher jobs: {sum(total.values())} ({total['rankguard run']} rankguard run, "
        f"{total['torchrun']} torchrun); interpreters: "
        f"{sum(c.interpreters for c in merged.values())}"
    )
    return 0 if all(r.rc in (0, 5) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
