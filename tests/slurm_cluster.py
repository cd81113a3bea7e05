"""A real one-node Slurm cluster on this machine, for the tests (tests only).

Debian's ``slurm-wlm`` (slurmctld, slurmd, the client commands) and ``munge``, started
as this user's own processes from a configuration generated into a temporary folder:
munged with a fresh key on a socket of its own, slurmctld and slurmd on free loopback
ports, one node (this host; a second one, :data:`SPARE`, is configured and never comes
up) and one partition, no cgroups (``proctrack/linuxproc``,
``task/none``), no accounting. The client commands find the cluster through
``SLURM_CONF`` (:meth:`SlurmCluster.env`); a batch job inherits it.

:func:`start` returns the running cluster, or the reason it cannot run here (the
binaries are missing, the daemons need root, a daemon did not come up): the tests skip
with that reason. :meth:`SlurmCluster.stop` ends the three daemons it started, by pid.

``python -m tests.slurm_cluster`` starts a cluster, runs ``sinfo`` and stops it: a
check that Slurm can run on this machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BINARIES", "SlurmCluster", "missing_binaries", "start"]

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun", "squeue", "scancel")
_START_TIMEOUT_S = 30.0


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"


SPARE = "spare0"
"""A second node that never comes up (DOWN, nothing listens on its port): a job told to
leave this host out can still be queued, and waits there."""


def _node_lines(host: str, spare_port: int) -> list[str]:
    """This host as ``slurmd -C`` sees it (its memory lowered so a test job fits), and
    the spare."""
    cpus = os.cpu_count() or 1
    return [
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
        f"NodeName={SPARE} NodeAddr=127.0.0.1 Port={spare_port} CPUs={cpus} "
        "RealMemory=1000 State=DOWN",
    ]


def _config(root: Path, host: str, ctld_port: int, slurmd_port: int) -> str:
    return "\n".join(
        [
            "ClusterName=rankguard-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge.socket'}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobRequeue=1",
            "MinJobAge=600",
            "KillWait=10",
            "SlurmctldDebug=debug",  # the timed --signal is logged at debug
            "SlurmdDebug=info",
            *_node_lines(host, _free_port()),
            f"PartitionName=test Nodes={host},{SPARE} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


@dataclass
class SlurmCluster:
    """Three daemons (munged, slurmctld, slurmd) and the folder of their configuration."""

    root: Path
    host: str
    conf: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    owns_root: bool = False

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands talk to this cluster."""
        out = dict(os.environ if base is None else base)
        out["SLURM_CONF"] = str(self.conf)
        return out

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def log(self, name: str) -> str:
        return _tail(self.root / f"{name}.log", 20)

    def stop(self) -> None:
        """End the daemons this cluster started (slurmd first), each by its pid."""
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)


def _spawn(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    out = open(cluster.root / f"{name}.out", "wb")  # noqa: SIM115 - kept for the process' life
    cluster.procs[name] = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=cluster.env(),
        start_new_session=True,  # a Ctrl-C of the test run is not theirs
    )
    out.close()


def _wait(cluster: SlurmCluster, what: str, ready: object, deadline: float) -> str | None:
    """None once ``ready()`` holds, else why not (a daemon exited, or the time ran out)."""
    assert callable(ready)
    while time.monotonic() < deadline:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                return (
                    f"{name} exited with {proc.returncode} while waiting for {what}: "
                    f"{_tail(cluster.root / f'{name}.out')} / {cluster.log(name)}"
                )
        if ready():
            return None
        time.sleep(0.2)
    return f"no {what} within {_START_TIMEOUT_S:g} s"


def start(root: Path | None = None) -> SlurmCluster | str:
    """A running one-node cluster, or the reason there cannot be one here."""
    missing = missing_binaries()
    if missing:
        return f"Slurm is not installed (missing: {', '.join(missing)}; Debian: slurm-wlm, munge)"
    if os.geteuid() != 0:
        return "the Slurm daemons run as root here (SlurmUser=root): not root"
    owns = root is None
    root = Path(tempfile.mkdtemp(prefix="rg-slurm-")) if root is None else Path(root)
    root.chmod(0o755)
    for sub in ("state", "spool"):
        (root / sub).mkdir(mode=0o755, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_config(root, host, _free_port(), _free_port()), encoding="utf-8")
    cluster = SlurmCluster(root=root, host=host, conf=conf, owns_root=owns)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    deadline = time.monotonic() + _START_TIMEOUT_S
    try:
        _spawn(
            cluster,
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={root / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={root / 'munged.pid'}",
                f"--log-file={root / 'munged.log'}",
                f"--seed-file={root / 'munged.seed'}",
            ],
        )
        why = _wait(cluster, "munge socket", (root / "munge.socket").exists, deadline)
        if why is None:
            _spawn(cluster, "slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(conf)])
            _spawn(cluster, "slurmd", ["slurmd", "-D", "-f", str(conf), "-N", host])
            why = _wait(cluster, "idle node", lambda: _idle(cluster), deadline)
    except OSError as exc:
        why = f"cannot start the Slurm daemons: {exc}"
    if why is not None:
        cluster.stop()
        return why
    return cluster


def _idle(cluster: SlurmCluster) -> bool:
    try:
        res = cluster.run("sinfo", "-h", "-n", cluster.host, "-o", "%T", timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return res.returncode == 0 and res.stdout.strip().startswith("idle")


def main() -> int:
    began = time.monotonic()
    cluster = start()
    if isinstance(cluster, str):
        print(f"slurm: cannot start: {cluster}", file=sys.stderr)
        return 1
    try:
        took = time.monotonic() - began
        print(f"slurm: started in {took:.1f} s: {cluster.run('sinfo').stdout.strip()}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
