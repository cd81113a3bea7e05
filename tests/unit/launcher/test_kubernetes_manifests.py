"""The manifests of docs/kubernetes.md configure the job they claim to.

Each manifest is read from the page, the environment the operator gives each pod is
built (the Kubeflow training operator's ``PET_*`` rules for a PyTorchJob; a JobSet's
indexed pods with their completion-index annotation and ``$(VAR)`` expansion of the
command), and rankguard's own parser reads each pod's command line in it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rankguard.cli.main import _FT_KEYS, _FT_SWITCHES
from rankguard.config import load_config
from rankguard.launcher import exitcodes
from rankguard.launcher.argv import nvrx_flags, pre_pass
from rankguard.launcher.options import LaunchOptions, parse_run_args
from rankguard.scheduler.kubeflow import kubeflow_exit_code

PAGE = Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md"
INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def manifests() -> dict[str, dict[str, Any]]:
    docs = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)]
    return {d["kind"]: d for d in docs}


def pytorchjob_pods(job: dict[str, Any]) -> list[tuple[dict[str, str], list[str]]]:
    """Each pod's ``PET_*`` environment and command, as the training operator sets them:
    the master is node 0, worker i is node i + 1; PET_NNODES counts every replica."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r["replicas"] for r in replicas.values())
    master = replicas["Master"]["template"]["spec"]["containers"][0]
    port = next(p["containerPort"] for p in master["ports"] if p["name"] == "pytorchjob-port")
    pods = []
    for rtype in ("Master", "Worker"):
        container = replicas[rtype]["template"]["spec"]["containers"][0]
        for index in range(replicas[rtype]["replicas"]):
            env = {
                "PET_NNODES": str(total),
                "PET_NPROC_PER_NODE": str(spec["nprocPerNode"]),
                "PET_NODE_RANK": str(index + (1 if rtype == "Worker" else 0)),
                "PET_MASTER_ADDR": f"{job['metadata']['name']}-master-0",
                "PET_MASTER_PORT": str(port),
            }
            pods.append((env, list(container["command"])))
    return pods


def _expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a container's command word."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], word)


def jobset_pods(js: dict[str, Any]) -> list[tuple[dict[str, str], list[str]]]:
    """Each indexed pod's environment (its completion index resolved) and its command
    with Kubernetes' ``$(VAR)`` expansion."""
    pods = []
    for rjob in js["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        assert job["completionMode"] == "Indexed"
        container = job["template"]["spec"]["containers"][0]
        for index in range(job["completions"]):
            env: dict[str, str] = {}
            for var in container["env"]:
                if "valueFrom" in var:
                    assert var["valueFrom"]["fieldRef"]["fieldPath"] == INDEX
                    env[var["name"]] = str(index)
                else:
                    env[var["name"]] = var["value"]
            command = [_expand(w, env) for w in container["command"]]
            pods.append((env, command))
    return pods


def launch_of(
    env: dict[str, str], command: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[LaunchOptions, Any]:
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert command[:2] == ["rankguard", "run"]
    argv = nvrx_flags(command[1:], _FT_KEYS, _FT_SWITCHES)[1:]
    pre = pre_pass(argv)
    opts, overrides = parse_run_args(argv)
    assert overrides == pre.overrides
    return opts, load_config(pre.config, overrides, defaults={"heartbeat.enabled": True})


def test_the_pytorchjob_gives_every_pod_its_node_and_the_masters_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = manifests()["PyTorchJob"]
    pods = pytorchjob_pods(job)
    assert len(pods) == 4
    for node, (env, command) in enumerate(pods):
        opts, cfg = launch_of(env, command, monkeypatch)
        assert (opts.min_nodes, opts.max_nodes, opts.nproc_per_node) == (4, 4, 8)
        assert opts.rdzv_backend == "static" and opts.node_rank == node
        assert opts.rdzv_endpoint == "llm-pretrain-master-0:23456"
        assert opts.target == "train.py" and opts.target_args == ["--config", "llm.yaml"]
        assert cfg.exit_codes == "kubeflow" and cfg.no_shared_fs  # relays, no shared volume
        assert cfg.heartbeat.enabled
    restart = {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()}
    assert restart == {"ExitCode"}


def test_the_jobset_gives_every_pod_its_index_and_one_c10d_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    js = manifests()["JobSet"]
    pods = jobset_pods(js)
    assert len(pods) == 4
    for node, (env, command) in enumerate(pods):
        opts, cfg = launch_of(env, command, monkeypatch)
        assert (opts.max_nodes, opts.nproc_per_node, opts.max_restarts) == (4, 8, 3)
        assert opts.rdzv_backend == "c10d"
        assert opts.rdzv_endpoint == "llm-pretrain-node-0-0.llm-pretrain:29400"
        assert opts.node_rank == node  # given: checked against the rendezvous' number
        assert opts.run_id() == "llm-pretrain" and cfg.exit_codes == "rankguard"
    # the permanent codes the podFailurePolicy fails on are the non-retryable ones
    rules = js["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    permanent = set(rules[0]["onExitCodes"]["values"])
    codes = {v for k, v in vars(exitcodes).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert permanent == codes - exitcodes.RETRYABLE - {exitcodes.EXIT_OK}


def test_the_pages_exit_code_table_is_the_mapping() -> None:
    rows = re.findall(r"^\|[^|]+\| (\d+) \| (\d+) \|", PAGE.read_text(), re.M)
    assert len(rows) == 12
    assert all(kubeflow_exit_code(int(a)) == int(b) for a, b in rows)
