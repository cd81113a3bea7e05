"""End to end: a rank forked by ``--preload``'s fork server finds the environment a
rank started as a new interpreter finds (the run's identity and files, the
configuration's ``envs``, the threads, the rendezvous settings), its ``/proc/PID/environ``
names its run (tools find a run's processes by it), and every rank comes from one fork
server, the launcher's child."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import no_leftover_workers, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

KEYS = (
    "RANKGUARD_RUN_ID",
    "RANKGUARD_LAUNCHER",
    "RANKGUARD_LAUNCHER_PID",
    "RANKGUARD_JOB",
    "RANKGUARD_LOG_DIR",
    "RANKGUARD_RUN_DIR",
    "RANKGUARD_CONFIG",
    "RANKGUARD_MAX_WORLD_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "GLOO_SOCKET_IFNAME",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "FOO_ENV",
    "RANK",
    "WORLD_SIZE",
    # set by the launcher after the fork server started: passed on to each forked rank
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "RANKGUARD_NVRX_SOCKET_DIR",
)
# a value of the launcher's own (its pid in it): present in both, or in neither
PER_LAUNCHER = ("RANKGUARD_LAUNCHER_PID", "RANKGUARD_CONFIG", "RANKGUARD_NVRX_SOCKET_DIR")

SCRIPT = """\
import json, os, sys
out = sys.argv[1]
me = os.getpid()
launcher = int(os.environ["RANKGUARD_LAUNCHER_PID"])
servers = []
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    try:
        stat = open(f"/proc/{entry}/stat").read()
        cmd = open(f"/proc/{entry}/cmdline", "rb").read()
    except OSError:
        continue
    if int(stat.rsplit(")", 1)[1].split()[1]) == launcher and b"forkserver" in cmd:
        servers.append(int(entry))
raw = open(f"/proc/{me}/environ", "rb").read().split(b"\\0")
seen = {
    "env": {k: os.environ.get(k) for k in KEYS},
    "ppid": os.getppid(),
    "servers": servers,
    "proc_run_id": [x.decode() for x in raw if x.startswith(b"RANKGUARD_RUN_ID=")],
}
with open(f"{out}.{os.environ['RANK']}.json", "w") as fh:
    json.dump(seen, fh)
"""


def _launch(tmp_path: Path, name: str, *extra: str) -> tuple[int, list[dict[str, object]]]:
    script = tmp_path / "dump_env.py"
    script.write_text(f"KEYS = {KEYS!r}\n" + SCRIPT)
    out = tmp_path / name
    res = run_rankguard(
        [
            *standalone_run(name, tmp_path / f"logs-{name}", nproc=2),
            *extra,
            "envs.FOO_ENV=bar",
            str(script),
            str(out),
        ],
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert no_leftover_workers(name)
    return res.returncode, [json.loads(Path(f"{out}.{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="/proc")
def test_forked_ranks_find_the_environment_of_new_interpreter_ranks(
    tmp_path: Path, run_id: str
) -> None:
    _, plain = _launch(tmp_path, f"{run_id}-p")
    _, forked = _launch(tmp_path, f"{run_id}-f", "--preload", "json")
    for rank, (a, b) in enumerate(zip(plain, forked, strict=True)):
        env_a, env_b = dict(a["env"]), dict(b["env"])  # type: ignore[call-overload]
        assert env_b["RANKGUARD_RUN_ID"] == f"{run_id}-f"
        assert env_b["FOO_ENV"] == "bar" and env_b["OMP_NUM_THREADS"] == "1"
        assert env_b["RANK"] == str(rank)
        assert env_b["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        for key in KEYS:  # the same, but for the run's own names and the launcher's pid
            want = env_a[key]
            if want is not None:
                want = want.replace(f"{run_id}-p", f"{run_id}-f")
            if key in PER_LAUNCHER:
                assert (env_b[key] is None) == (want is None), key
                continue
            assert env_b[key] == want, key
        # a tool that finds a run's processes by their environment finds the rank
        assert b["proc_run_id"] == [f"RANKGUARD_RUN_ID={run_id}-f"]
        # one fork server, the launcher's child: every rank's parent
        assert b["servers"] == [b["ppid"]], b
    assert forked[0]["ppid"] == forked[1]["ppid"]
