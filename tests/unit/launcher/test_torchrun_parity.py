"""``rankguard run`` reads a torchrun command line as torchrun does.

Each line of the table goes through torch's own ``torch.distributed.run.run`` (its
launch stood in by a recorder, so the config and entry point it would launch are
captured) and through rankguard's parser; the two must agree field by field. The same
lines are then given through ``PET_*`` variables only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.run as torchrun

from rankguard.launcher.argv import TORCH_SWITCHES, pre_pass
from rankguard.launcher.elastic import entrypoint
from rankguard.launcher.options import (
    ENTRY_NO_PYTHON,
    ENTRY_RUN_PATH,
    LaunchOptions,
    build_run_parser,
    parse_run_args,
)
from rankguard.launcher.worker import run_path_main

LINES: list[list[str]] = [
    ["t.py"],
    ["--nproc-per-node", "4", "t.py", "--lr", "1"],
    ["--nproc_per_node=2", "t.py"],
    ["--nproc-per-node", "cpu", "t.py"],
    ["--nproc-per-node", "auto", "t.py"],
    ["--standalone", "--nproc-per-node", "2", "t.py"],
    [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "1234",
        "t.py",
    ],
    ["--nnodes", "2", "--node_rank", "0", "--master_addr", "h", "--master_port", "29500", "t.py"],
    ["--nnodes", "2", "--rdzv-endpoint", "h:1", "t.py"],
    [
        "--nnodes",
        "1:4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h:29400",
        "--rdzv-id",
        "j",
        "t.py",
    ],
    [
        "--nnodes=2:3",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=h:1",
        "--rdzv_id=j",
        "--rdzv_conf=join_timeout=5,last_call_timeout=2",
        "t.py",
    ],
    ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "t.py"],
    ["--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "h:2379", "t.py"],
    ["--max-restarts", "3", "--monitor-interval", "0.5", "t.py"],
    ["--max_restarts=1", "--monitor_interval=1", "t.py"],
    ["--start-method", "fork", "--run-path", "/abs/t.py", "a", "b"],
    ["--start_method", "forkserver", "--run_path", "t.py"],
    ["--no-python", "./run.sh", "x"],
    ["--no_python", "./run.sh"],
    ["-m", "pkg.train", "--epochs", "1"],
    ["--module", "pkg.train"],
    ["--role", "trainer", "t.py"],
    ["--log-dir", "LOGS", "--redirects", "3", "--tee", "1", "t.py"],
    ["--log_dir", "LOGS", "-r", "0:1,1:2", "-t", "3", "--nproc-per-node", "2", "t.py"],
    ["--local-ranks-filter", "0,1", "--nproc-per-node", "2", "t.py"],
    ["--local-addr", "127.0.0.1", "t.py"],
    ["--event-log-handler", "console", "t.py"],
    ["--signals-to-handle", "SIGTERM,SIGUSR1", "--shutdown-timeout", "5", "t.py"],
    ["--virtual-local-rank", "--nproc-per-node", "2", "t.py"],
    ["--duplicate-stdout-filters", "loss,acc", "t.py"],
    ["--numa-binding", "node", "t.py"],
    ["--nnodes", "1", "--nproc-per-node", "3", "t.py", "--", "-x"],
]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # torch's default log dirs
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", raising=False)
    for name in list(__import__("os").environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def _line(words: list[str], tmp_path: Path) -> list[str]:
    return [str(tmp_path / "logs") if w == "LOGS" else w for w in words]


def torchrun_launch(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What torch's own ``run`` would launch for ``argv``: its LaunchConfig, entry point
    and arguments."""
    seen: dict[str, Any] = {}

    def recorder(config: Any, entrypoint: Any) -> Any:
        seen["config"], seen["entrypoint"] = config, entrypoint
        return lambda *args: seen.__setitem__("args", list(args))

    monkeypatch.setattr(torchrun, "elastic_launch", recorder)
    torchrun.run(torchrun.get_args_parser().parse_args(argv))
    return seen


def _logs(specs: Any) -> tuple[Any, ...]:
    return (specs._redirects, specs._tee, specs._local_ranks_filter)


def assert_same(theirs: dict[str, Any], opts: LaunchOptions, line: list[str]) -> None:
    ref, mine = theirs["config"], opts.elastic
    for name in (
        "min_nodes",
        "max_nodes",
        "nproc_per_node",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_configs",
        "max_restarts",
        "monitor_interval",
        "start_method",
        "role",
        "local_addr",
        "event_log_handler",
        "signals_to_handle",
        "shutdown_timeout",
        "virtual_local_rank",
        "duplicate_stdout_filters",
        "duplicate_stderr_filters",
        "numa_options",
        "log_line_prefix_template",
    ):
        assert getattr(mine, name) == getattr(ref, name), (name, line)
    # what rankguard's launcher itself uses
    assert (opts.min_nodes, opts.max_nodes, opts.nproc_per_node) == (
        ref.min_nodes,
        ref.max_nodes,
        ref.nproc_per_node,
    ), line
    assert opts.rdzv_backend == ref.rdzv_backend, line
    local = ref.rdzv_endpoint == "localhost:0"  # torchrun's local rendezvous
    assert opts.standalone == local, line
    assert opts.rdzv_endpoint == (None if local else ref.rdzv_endpoint), line
    assert opts.rdzv_conf == ref.rdzv_configs, line
    assert (opts.max_restarts, opts.monitor_interval_s) == (ref.max_restarts, ref.monitor_interval)
    assert (opts.start_method, opts.role) == (ref.start_method, ref.role), line
    assert _logs(opts.logs_specs) == _logs(ref.logs_specs), line
    if "LOGS" in " ".join(line) or "--log-dir" in line or "--log_dir" in line:
        assert opts.logs_specs.root_log_dir == ref.logs_specs.root_log_dir, line
    # the entry point: torch's, behind rankguard's bootstrap for a Python rank
    entry, args, _ = entrypoint(opts)
    if opts.entry == ENTRY_RUN_PATH:
        assert theirs["entrypoint"] is torchrun.run_script_path and entry is run_path_main
        assert args == theirs["args"], line
    elif opts.entry == ENTRY_NO_PYTHON:
        assert entry == theirs["entrypoint"] and args == theirs["args"], line
    else:
        assert entry == theirs["entrypoint"] == sys.executable
        assert args[:3] == ["-u", "-m", "rankguard.launcher.worker"]
        assert ["-u", *args[3:]] == theirs["args"], line


@pytest.mark.parametrize("words", LINES, ids=[" ".join(w) for w in LINES])
def test_a_torchrun_line_means_what_torchrun_makes_of_it(
    words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _line(words, tmp_path)
    theirs = torchrun_launch(line, monkeypatch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    opts, overrides = parse_run_args(line)
    assert_same(theirs, opts, words)
    assert overrides == ([f"log_dir={tmp_path / 'logs'}"] if "LOGS" in words else [])


def _as_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """The flags of a torchrun line as ``PET_*`` variables; the script and its words."""
    actions = {o: a for a in torchrun.get_args_parser()._actions for o in a.option_strings}
    env: dict[str, str] = {}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        flag, eq, value = words[i].partition("=")
        action = actions[flag]
        if action.nargs == 0:
            value = "1"
        elif not eq:
            i += 1
            value = words[i]
        env[f"PET_{action.dest.upper()}"] = value
        i += 1
    return env, words[i:]


ENV_LINES = [w for w in LINES if _as_env(w)[0] and "--logs-specs" not in w]
ENV_LINES = [w for w in ENV_LINES if not {"--numa-binding", "--logs-specs"} & set(w)]


@pytest.mark.parametrize("words", ENV_LINES, ids=[" ".join(w) for w in ENV_LINES])
def test_the_same_line_through_pet_variables(
    words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, rest = _as_env(_line(words, tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    theirs = torchrun_launch(rest, monkeypatch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    opts, _ = parse_run_args(rest)
    assert_same(theirs, opts, words)


def test_an_explicit_flag_wins_over_its_pet_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NODE_RANK", "1")
    monkeypatch.setenv("PET_MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("PET_MASTER_PORT", "23456")
    opts, _ = parse_run_args(["--nproc-per-node", "2", "t.py"])
    assert opts.nproc_per_node == 2
    assert (opts.max_nodes, opts.node_rank, opts.rdzv_backend) == (2, 1, "static")
    assert opts.rdzv_endpoint == "10.1.2.3:23456"


def test_every_torchrun_flag_is_a_rankguard_run_flag() -> None:
    # fails as soon as the installed torch has a flag (or spelling) rankguard lacks
    theirs = {o: a for a in torchrun.get_args_parser()._actions for o in a.option_strings}
    ours = {o: a for a in build_run_parser()._actions for o in a.option_strings}
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"torchrun flags rankguard run lacks: {missing}"
    for flag, action in theirs.items():  # with torchrun's meaning: dest, default, choices
        mine = ours[flag]
        assert (mine.dest, mine.default, mine.choices, mine.nargs) == (
            action.dest,
            action.default,
            action.choices,
            action.nargs,
        ), flag


def test_the_light_pre_pass_knows_which_torchrun_flags_take_no_value() -> None:
    theirs = {
        o
        for a in torchrun.get_args_parser()._actions
        for o in a.option_strings
        if a.nargs == 0 and not isinstance(a, argparse._VersionAction)
    }
    assert theirs == TORCH_SWITCHES


@pytest.mark.parametrize("words", LINES, ids=[" ".join(w) for w in LINES])
def test_the_pre_pass_finds_the_script_where_torchrun_does(words: list[str]) -> None:
    line = ["heartbeat.enabled=false", *words]
    pre = pre_pass(line)
    assert pre.has_script and pre.overrides[-1] == "heartbeat.enabled=false"
    assert pre.no_python == bool({"--no-python", "--no_python"} & set(words))


def test_an_unknown_logs_specs_plugin_is_refused_as_torchrun_refuses_it() -> None:
    with pytest.raises(ValueError, match=r"torchrun\.logs_specs"):
        parse_run_args(["--logs-specs", "nope", "t.py"])
