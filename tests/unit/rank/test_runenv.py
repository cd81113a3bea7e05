"""RunEnv: the launcher's environment parsed in one place, and nowhere else."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rankguard.config import RankguardConfig, dumps_config, load_config, run_config
from rankguard.preempt.config import PreemptionConfig
from rankguard.rank import runenv
from rankguard.rank.identity import ENV as IDENTITY_ENV
from rankguard.rank.identity import RankIdentity
from rankguard.rank.runenv import ELASTIC, ENV, NAMES, RunEnv

SRC = Path(runenv.__file__).resolve().parents[1]


def _launcher_env(**extra: str) -> dict[str, str]:
    cfg = RankguardConfig()
    cfg.preemption.exit_signal = "SIGUSR1"
    return {
        ENV.LAUNCHER: "1",
        ENV.RUN_ID: "run-7",
        ENV.RUN_DIR: "/tmp/rg/heartbeat/run-7",
        ENV.NODE_RANK: "2",
        ENV.CONFIG: dumps_config(cfg),
        ENV.LOG_DIR: "/tmp/rg",
        ENV.JOB: "/tmp/train.py",
        ENV.LAUNCHER_PID: "4242",
        ELASTIC.RANK: "9",
        ELASTIC.LOCAL_RANK: "1",
        ELASTIC.WORLD_SIZE: "16",
        ELASTIC.LOCAL_WORLD_SIZE: "4",
        ELASTIC.GROUP_RANK: "3",
        ELASTIC.RUN_ID: "elastic-1",
        ELASTIC.RESTART_COUNT: "2",
        ELASTIC.MASTER_ADDR: "127.0.0.1",
        ELASTIC.MASTER_PORT: "29500",
        **extra,
    }


def test_every_variable_of_a_launched_rank() -> None:
    env = RunEnv.from_environ(_launcher_env())
    assert env.launcher and env.monitored and not env.torchrun
    assert (env.run_id, env.run_dir, env.log_dir, env.job) == (
        "run-7",
        "/tmp/rg/heartbeat/run-7",
        "/tmp/rg",
        "/tmp/train.py",
    )
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (9, 1, 16, 4)
    assert env.node == 2  # the launcher's node rank before torch elastic's group rank
    assert (env.restart_count, env.master_addr, env.master_port) == (2, "127.0.0.1", 29500)
    assert env.launcher_pid == 4242 and env.job_id == "run-7"
    cfg = run_config(env)
    assert cfg is not None and cfg.preemption.exit_signal == "SIGUSR1"
    assert run_config(env) is cfg  # decoded once
    # one section, decoded by its own class as the root config decodes it, once
    section = env.section("preemption", PreemptionConfig)
    assert section == cfg.preemption and env.section("preemption", PreemptionConfig) is section
    assert env.raw_section("preemption")["exit_signal"] == "SIGUSR1"


def test_every_section_decodes_alone_as_the_root_config_decodes_it() -> None:
    """What a component below the root config reads (its own section) is what the root
    config holds, for every section, with settings away from their defaults."""
    cfg = load_config(
        overrides=[
            "heartbeat.process_timeout_s=7",
            "checkpoint.save=/tmp/ck",
            "checkpoint.save_interval=5",
            "inprocess_restart.enabled=true",
            "rerun_state_machine.rerun_mode=validate_results",
            "preemption.exit_signal=SIGUSR2",
            "fault_tolerance.num_in_job_restarts=3",
        ]
    )
    env = RunEnv.from_environ(_launcher_env(**{ENV.CONFIG: dumps_config(cfg)}))
    sections = [
        f for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))
    ]
    assert len(sections) >= 9
    for f in sections:
        value = getattr(cfg, f.name)
        assert env.section(f.name, type(value)) == value, f.name


def test_defaults_outside_any_launcher() -> None:
    env = RunEnv.from_environ({})
    assert not env.launcher and not env.monitored and not env.torchrun
    assert (env.rank, env.local_rank, env.world_size, env.restart_count) == (0, 0, 1, 0)
    assert env.local_world_size is None and env.node == 0 and env.job_id is None
    assert run_config(env) is None and env.raw_section("preemption") == {}
    assert env.section("preemption", PreemptionConfig) is None


def test_plain_torchrun_and_the_group_rank() -> None:
    env = RunEnv.from_environ({ELASTIC.RUN_ID: "none", ELASTIC.GROUP_RANK: "5"})
    assert env.torchrun and not env.monitored
    assert env.node == 5
    assert env.job_id is None  # torchrun's default id names no job
    assert RunEnv.from_environ({"SLURM_JOB_ID": "123"}).job_id == "123"


def test_the_config_needs_the_launcher_flag() -> None:
    env = RunEnv.from_environ(_launcher_env(**{ENV.LAUNCHER: "0"}))
    assert run_config(env) is None and not env.monitored
    assert env.section("preemption", PreemptionConfig) is None
    # the raw sections stay readable (a DataLoader worker's signal, whatever started it)
    assert env.raw_section("preemption")["exit_signal"] == "SIGUSR1"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (ELASTIC.RANK, "x", r"RANK: expected an integer, got 'x'"),
        (ELASTIC.LOCAL_RANK, "-1", r"LOCAL_RANK: must be >= 0, got -1"),
        (ELASTIC.WORLD_SIZE, "0", r"WORLD_SIZE: must be >= 1, got 0"),
        (ELASTIC.RESTART_COUNT, "1.5", r"TORCHELASTIC_RESTART_COUNT: expected an integer"),
        (ELASTIC.MASTER_PORT, "http", r"MASTER_PORT: expected an integer"),
        (ENV.NODE_RANK, "node0", r"RANKGUARD_NODE_RANK: expected an integer"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunEnv.from_environ({name: value})


@pytest.mark.parametrize("value", ["", "abc", "0", "1", "-4"])
def test_a_launcher_pid_that_is_no_pid_means_no_lifeline(value: str) -> None:
    assert RunEnv.from_environ({ENV.LAUNCHER_PID: value}).launcher_pid is None


def test_a_bad_config_json_reads_as_no_section() -> None:
    env = RunEnv.from_environ({ENV.CONFIG: "{not json"})
    assert env.raw_section("preemption") == {}


def test_current_parses_again_only_when_a_variable_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ELASTIC.RANK, "3")
    first = runenv.current()
    assert first.rank == 3
    assert runenv.current() is first  # same variables: the same object (config decoded once)
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    assert runenv.current() is first  # not one of its variables
    monkeypatch.setenv(ELASTIC.RANK, "4")
    assert runenv.current().rank == 4


def test_identity_reads_through_it_and_keeps_the_env_names() -> None:
    assert IDENTITY_ENV is ENV  # the one contract, re-exported where callers import it
    ident = RankIdentity.from_env(_launcher_env(CUDA_VISIBLE_DEVICES=""))
    assert (ident.run_id, ident.rank, ident.local_rank, ident.world_size) == ("run-7", 9, 1, 16)
    assert ident.node_rank == 2
    assert RankIdentity.from_env({}).run_id == "local"
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        RankIdentity.from_env({ELASTIC.WORLD_SIZE: "many"})


# ---- nothing else reads the launcher's variables --------------------------------------

#: Reading a variable: ``environ.get(X``, ``environ[X]`` not assigned, ``getenv(X``,
#: ``X in environ``; X a contract name as a literal or through ``ENV.``/``ELASTIC.``.
_LITERALS = "|".join(map(re.escape, NAMES))
_NAME = rf"""(?:["'](?:{_LITERALS})["']|\b(?:ENV|ELASTIC)\.[A-Z_]+)"""
_READS = re.compile(
    rf"""environ\.get\(\s*{_NAME}|environ\[\s*{_NAME}\s*\](?!\s*=[^=])|getenv\(\s*{_NAME}"""
    rf"""|{_NAME}\s+(?:not\s+)?in\s+(?:os\.)?environ"""
)
#: The contract's owners.
_OWNERS = {"rank/runenv.py", "rank/identity.py"}


def test_the_read_pattern_catches_what_it_must() -> None:
    caught = [
        'os.environ.get("RANK", "0")',
        "os.environ[ENV.RUN_DIR]",
        "os.getenv('TORCHELASTIC_RESTART_COUNT')",
        "env.get(ENV.CONFIG) if x else os.environ.get(ELASTIC.MASTER_ADDR)",
        '"LOCAL_WORLD_SIZE" in os.environ',
    ]
    missed = [
        "os.environ[ENV.RUN_ID] = run_id",  # the launcher sets the contract
        'os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")',  # not the launcher's
        'os.environ.setdefault("PYTHONUNBUFFERED", "1")',
    ]
    assert all(_READS.search(line) for line in caught)
    assert not any(_READS.search(line) for line in missed)


def test_no_module_outside_runenv_reads_the_launchers_variables() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in _OWNERS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _READS.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == [], "read these through rankguard.rank.runenv.RunEnv:\n" + "\n".join(
        offenders
    )
