"""``--preload``'s fork server starts before the launcher imports torch: what it reads
of the line, the environment it starts with, and what the ranks get afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rankguard.launcher import earlyfork


@pytest.mark.parametrize(
    ("argv", "modules"),
    [
        (["--preload", "torch", "train.py"], ("torch",)),
        (["--preload=torch,json", "--nproc-per-node", "2", "train.py"], ("torch", "json")),
        (["a.b=1", "--standalone", "--preload", "torch", "train.py"], ("torch",)),
        (["--nproc-per-node", "2", "train.py", "--preload", "torch"], ()),  # the script's
        (["-r3", "--preload", "json", "train.py"], ("json",)),
        (["train.py"], ()),
    ],
)
def test_the_modules_are_read_up_to_the_script(argv: list[str], modules: tuple[str, ...]) -> None:
    assert earlyfork.preload_requested(argv) == modules


def test_pet_preload_stands_for_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_PRELOAD", "torch")
    assert earlyfork.preload_requested(["train.py"]) == ("torch",)
    assert earlyfork.preload_requested(["--preload", "json", "train.py"]) == ("json",)


def test_the_run_id_is_the_launchs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PET_RDZV_ID", raising=False)
    monkeypatch.delenv("PET_NNODES", raising=False)
    assert earlyfork._run_id(["--rdzv-id", "job7", "t.py"]) == "job7"
    assert earlyfork._run_id(["--run-id=job8", "t.py"]) == "job8"
    assert earlyfork._run_id(["--nnodes", "2", "t.py"]) == "none"
    assert earlyfork._run_id(["--nnodes", "x", "t.py"]) is None
    made = earlyfork._run_id(["--standalone", "t.py"])
    assert made is not None and made not in ("none", "")
    assert earlyfork.take_run_id() == made  # the launch takes the one made here, once
    assert earlyfork.take_run_id() is None


def test_the_ranks_get_what_the_launcher_set_after_the_server_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = {"KEEP": "1", "GONE": "x", "CHANGED": "old", "RANK": "9"}
    monkeypatch.setattr(earlyfork, "_server_env", server)
    launcher = {"KEEP": "1", "CHANGED": "new", "ADDED": "a", "RANK": "3", "OMP_NUM_THREADS": "4"}
    arg = earlyfork.env_argument(launcher)
    assert len(arg) == 1 and arg[0].startswith(earlyfork.ENV_ARG_PREFIX)
    assert "$" not in arg[0]  # torch elastic substitutes ${local_rank} in arguments
    for key, value in {"GONE": "x", "CHANGED": "old", "RANK": "0", "KEEP": "1"}.items():
        monkeypatch.setenv(key, value)  # a forked rank: the server's, then torch's own
    monkeypatch.delenv("ADDED", raising=False)
    rest = earlyfork.apply_env_argument((*arg, "train.py", "--lr", "1"))
    assert rest == ("train.py", "--lr", "1")
    assert os.environ["CHANGED"] == "new" and os.environ["ADDED"] == "a"
    assert "GONE" not in os.environ
    assert os.environ["RANK"] == "0"  # torch elastic's per-worker value wins
    assert earlyfork.apply_env_argument(("train.py",)) == ("train.py",)


def test_no_argument_when_the_server_was_not_started_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(earlyfork, "_server_env", None)
    assert earlyfork.env_argument({"A": "1"}) == []


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_fork_server_runs_before_the_launcher_imports_torch(tmp_path: Path) -> None:
    """``rankguard run --preload``: when torchrun's parser (which imports torch) is
    reached, the fork server already runs, with what it must have before its own
    import of torch; the launcher's environment is left as it was."""
    script = tmp_path / "train.py"
    script.write_text("")
    out = tmp_path / "seen.json"
    code = (
        "import json, multiprocessing.forkserver as fs, os, sys, time\n"
        "from rankguard.cli import main\n"
        "def seen(argv, pre, cfg, defaults):\n"
        "    server, env = fs._forkserver._forkserver_pid, b''\n"
        "    for _ in range(100):  # its /proc files read empty until its exec is done\n"
        "        if server and b'forkserver' in open(f'/proc/{server}/cmdline', 'rb').read():\n"
        "            env = open(f'/proc/{server}/environ', 'rb').read()\n"
        "            break\n"
        "        time.sleep(0.1)\n"
        "    json.dump({'torch': 'torch' in sys.modules, 'server': server,\n"
        "               'server_env': env.decode(), 'omp': os.environ.get('OMP_NUM_THREADS'),\n"
        "               'foo': os.environ.get('FOO_ENV'), 'pid': os.getpid()},\n"
        f"              open({str(out)!r}, 'w'))\n"
        "    return 0\n"
        "main._parse_and_launch = seen\n"
        f"sys.exit(main.run_main(['--standalone', '--nproc-per-node', '2', '--log-dir',"
        f" {str(tmp_path / 'logs')!r}, '--rdzv-id', 'early1', '--preload', 'json',"
        f" 'envs.FOO_ENV=bar', {str(script)!r}]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "FOO_ENV")}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    seen = json.loads(out.read_text())
    assert not seen["torch"]  # the launcher has not imported torch yet
    assert seen["server"], "no fork server before the launcher's import of torch"
    server_env = dict(i.partition("=")[::2] for i in seen["server_env"].split("\0") if i)
    assert server_env["OMP_NUM_THREADS"] == "1"  # 2 ranks: before its OpenMP loads
    assert server_env["FOO_ENV"] == "bar"  # the configuration's envs
    assert server_env["RANKGUARD_LAUNCHER_PID"] == str(seen["pid"])  # it dies with it
    assert server_env["RANKGUARD_RUN_ID"] == "early1"  # its ranks name their run
    assert seen["omp"] is None and seen["foo"] is None  # the launcher's: as it was


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_launch_refused_after_the_server_started_leaves_no_process(tmp_path: Path) -> None:
    """torchrun's parser refuses the line after the fork server started: the server
    goes with the launcher (it forked no rank)."""
    script = tmp_path / "train.py"
    script.write_text("")
    tag = f"RG_EARLYFORK_TEST={uuid.uuid4().hex}"
    env = {**os.environ, tag.partition("=")[0]: tag.partition("=")[2]}
    res = subprocess.run(
        [sys.executable, "-m", "rankguard.cli.main", "run", "--nnodes", "3:2", "--log-dir",
         str(tmp_path / "logs"), "--preload", "json", str(script)],
        env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert res.returncode == 2 and "--nnodes: need 1 <= min <= max" in res.stderr, res.stderr
    deadline = time.monotonic() + 10
    left: list[int] = []
    while time.monotonic() < deadline:
        left = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if tag.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                        left.append(int(entry))
                except OSError:
                    continue
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"left behind by a refused launch: {left}\n{res.stderr}"
