"""How fast ``rankguard run`` says a user's mistake (wall and CPU seconds, interpreter
start included).

A configuration mistake (an unknown key, a malformed YAML file, an unwritable
``log_dir``) is found before torch is imported; a mistake in a torchrun flag's value
needs torch's parser. Each case runs the real CLI ``--repeat`` times; the figures are
the median wall time and the median CPU time (user + system) of the whole command.

    python bench/cli_errors.py            # 5 runs per case
    python bench/cli_errors.py --smoke    # 1 run per case
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _once(args: list[str], cwd: Path) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rankguard.cli.main", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="one run per case")
    args = p.parse_args()
    repeat = 1 if args.smoke else max(1, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "train.py").write_text("pass\n")
        (cwd / "bad.yaml").write_text("heartbeat: [1,\n")
        (cwd / "afile").write_text("")
        cases = {
            "unknown config key": ["heartbeat.nope=1", "train.py"],
            "malformed YAML": ["--config", "bad.yaml", "train.py"],
            "log_dir under a file": ["--set", "log_dir=afile/logs", "train.py"],
            "missing script": ["nope.py"],
            "bad --nproc-per-node (torch's parser)": ["--nproc-per-node", "many", "train.py"],
        }
        print(
            f"rankguard run, a user's mistake: median of {repeat} run(s), "
            f"load {os.getloadavg()[0]:.1f}"
        )
        for name, words in cases.items():
            runs = [_once(words, cwd) for _ in range(repeat)]
            codes = {code for _, _, code in runs}
            wall = statistics.median(w for w, _, _ in runs)
            cpu = statistics.median(c for _, c, _ in runs)
            print(f"  {name:40s} exit {sorted(codes)}  {wall:5.2f} s wall  {cpu:5.2f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
