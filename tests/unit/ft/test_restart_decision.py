"""Restart or stop: a labelled set of failures through the fingerprint and the decision.

Every deterministic failure stops (at its first attempt when it fails before the first
step; at its second when the same failure repeats at the same iteration); no transient
failure ever stops, however often it repeats and without progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rankguard.ft.decide import FailureKind, RestartDecider, Rule, classify
from rankguard.ft.fingerprint import Fingerprint, normalise_message, split_error, user_frames

SITE = "/usr/lib/python3.11/site-packages"


def traceback(user: list[tuple[str, int, str]], error: str) -> str:
    """A traceback through rankguard's bootstrap into the user's frames."""
    lines = ["Traceback (most recent call last):"]
    lines += [
        f'  File "{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", '
        "line 367, in wrapper",
        '  File "/opt/venv/src/rankguard/launcher/worker.py", line 184, in main',
    ]
    for path, line, func in user:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append("    some_code()")
    lines.append(error)
    return "\n".join(lines) + "\n"


@dataclass
class Attempt:
    error: str | None = None
    stack: list[tuple[str, int, str]] = field(default_factory=list)
    exit_code: int | None = 1
    signal: str | None = None
    finding: str | None = None
    note: str | None = None
    phase: str | None = "train"
    iteration: int | None = None  # where the failing rank was
    reached: int | None = None  # the highest iteration after a step of the attempt
    before_first_step: bool | None = False

    def fingerprint(self) -> Fingerprint:
        return Fingerprint.build(
            error=self.error,
            callstack=traceback(self.stack, self.error) if self.error and self.stack else None,
            exit_code=self.exit_code,
            signal=self.signal,
            finding_type=self.finding,
            phase=self.phase,
            iteration=self.iteration,
            before_first_step=self.before_first_step,
            note=self.note,
        )


def startup(error: str | None, **kw: Any) -> Attempt:
    """A failure before the first step."""
    return Attempt(
        error=error,
        phase="setup",
        before_first_step=True,
        stack=kw.pop("stack", [("/home/u/train.py", 3, "<module>")]),
        **kw,
    )


def at_step(error: str, step: int, **kw: Any) -> Attempt:
    return Attempt(
        error=error,
        iteration=step,
        reached=step,
        stack=kw.pop("stack", [("/home/u/train.py", 40, "main"), ("/home/u/model.py", 9, "fwd")]),
        **kw,
    )


# deterministic at start-up: one attempt each
DETERMINISTIC_STARTUP = {
    "import": startup("ImportError: cannot import name 'Foo' from 'mylib' (/home/u/mylib.py)"),
    "module": startup("ModuleNotFoundError: No module named 'not_a_module'"),
    "module_socket": startup("ModuleNotFoundError: No module named 'socketserver_x'"),
    "syntax": startup("SyntaxError: invalid syntax (train.py, line 12)", stack=[]),
    "indent": startup("IndentationError: unexpected indent (model.py, line 7)", stack=[]),
    "name": startup("NameError: name 'optimiser' is not defined"),
    "data_file": startup(
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/shard_0001.bin'"
    ),
    "data_dir": startup("NotADirectoryError: [Errno 20] Not a directory: '/data/x'"),
    "tokenizer": startup("FileNotFoundError: tokenizer.json not found in ./ckpt/tok"),
    "argparse_exit": startup(None, exit_code=2, stack=[]),
    "argparse_record": startup("SystemExit(2)", exit_code=2, stack=[]),  # process_end's
    "argparse_error": startup("ArgumentError: argument --lr: invalid float value: 'x'"),
    "bad_value": startup("ValueError: batch_size must be divisible by world_size 8, got 12"),
    "bad_type": startup("TypeError: __init__() got an unexpected keyword argument 'lrr'"),
    "config_key": startup("KeyError: 'model.hidden_size'"),
    "config_attr": startup("AttributeError: 'Namespace' object has no attribute 'seq_len'"),
    "omegaconf": startup("omegaconf.errors.ConfigAttributeError: Missing key optim"),
    "omegaconf_missing": startup("omegaconf.errors.MissingMandatoryValue: optim.lr"),
    "pydantic": startup("pydantic_core._pydantic_core.ValidationError: 1 validation error"),
    "shape_load": startup(
        "RuntimeError: Error(s) in loading state_dict for GPT: size mismatch for "
        "wte.weight: copying a param with shape torch.Size([50304, 768]) from checkpoint, "
        "the shape in current model is torch.Size([50257, 768])."
    ),
    "shape_matmul": startup(
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x32 and 64x10)"
    ),
    "shape_broadcast": startup(
        "RuntimeError: The size of tensor a (3) must match the size of tensor b (4) at "
        "non-singleton dimension 1"
    ),
    "shape_view": startup("RuntimeError: shape '[2, 3]' is invalid for input of size 5"),
    "config_error": startup("ConfigError: model.layers: must be > 0, got 0"),
    # as torch and the parsers say them (bench/restart_or_stop.py raises them for real)
    "shape_load_lines": startup(
        "RuntimeError: Error(s) in loading state_dict for Linear:\n\tsize mismatch for "
        "weight: copying a param with shape torch.Size([5, 8]) from checkpoint, the shape "
        "in current model is torch.Size([4, 8])."
    ),
    "shape_cat": startup(
        "RuntimeError: Sizes of tensors must match except in dimension 0. Expected size 3 "
        "but got size 4 for tensor number 1 in the list."
    ),
    "embedding_index": startup("IndexError: index out of range in self"),
    "config_json": startup(
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: "
        "line 1 column 13 (char 12)"
    ),
    "config_yaml": startup(
        'yaml.parser.ParserError: while parsing a flow sequence\n  in "<unicode string>", '
        "line 1, column 8:\n    model: [dim: 512\nexpected ',' or ']', but got '<stream end>'"
    ),
    "config_toml": startup("tomllib.TOMLDecodeError: Expected '=' after a key (at line 3)"),
}

# the same failure at the same step twice: the second attempt stops
REPEATS = {
    "value_at_step": at_step("ValueError: NaN in batch 1234 of shard 7", 120),
    "zero_division": at_step("ZeroDivisionError: division by zero", 57),
    "runtime_at_step": at_step("RuntimeError: expected scalar type Float but found Half", 3),
    "assert_at_step": at_step("AssertionError: tokens out of range: 50301 >= 50257", 999),
    "custom_at_step": at_step("DataCorruptError: record 0x7f3a2b checksum 1234", 42),
    "index_at_step": at_step("IndexError: index 4096 is out of bounds for dimension 0", 88),
    "same_at_startup": startup("RuntimeError: my own start-up check failed on host node-12"),
    "oom_same_step": at_step("torch.OutOfMemoryError: Tried to allocate 2.00 GiB", 10),
}

# transient: never stopped, even repeated at the same place, even without progress
TRANSIENT = {
    "sigkill": Attempt(exit_code=-9, signal="SIGKILL", iteration=30, reached=30),
    "sigkill_startup": Attempt(exit_code=-9, signal="SIGKILL", before_first_step=True),
    "oom_kill": Attempt(exit_code=-9, signal="SIGKILL", note="oom-kill: killed by the kernel"),
    "sigsegv": Attempt(exit_code=-11, signal="SIGSEGV", iteration=5, reached=5),
    "sigbus_startup": Attempt(exit_code=-7, signal="SIGBUS", before_first_step=True),
    "sigterm": Attempt(exit_code=-15, signal="SIGTERM", iteration=7, reached=7),
    "hang": Attempt(exit_code=-9, signal="SIGKILL", finding="gpu_progress_timeout"),
    "hang_no_signal": Attempt(exit_code=1, finding="rank_process_heartbeat_timeout"),
    "section_hang": Attempt(finding="rank_section_timeout", before_first_step=True),
    "lost_peer": at_step(
        "RuntimeError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed "
        "by peer [127.0.0.1]:29500",
        12,
    ),
    "lost_peer_startup": startup("torch.distributed.DistNetworkError: failed to recv, got 0 bytes"),
    "store_timeout": startup("torch.distributed.DistStoreError: wait timeout after 300000ms"),
    "nccl": at_step("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled", 9),
    "nccl_watchdog": at_step("RuntimeError: [Rank 3] Watchdog caught collective timeout", 9),
    "cuda_error": at_step("RuntimeError: CUDA error: an illegal memory access", 9),
    "xid": Attempt(finding="gpu_hardware_health_failure", note="Xid 79: GPU has fallen off"),
    "xid_message": startup("RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    "nan_rerun": Attempt(exit_code=16, finding="rerun_persistent_fault", iteration=40),
    "nan_rerun_exit": Attempt(exit_code=16, iteration=40, reached=40),
    "timeout_error": startup("TimeoutError: timed out waiting for the dataset server"),
    "connection": startup("ConnectionResetError: [Errno 104] Connection reset by peer"),
    "disk_full_finding": Attempt(finding="node_disk_full", iteration=3),
}


def run(attempts: list[Attempt], max_no_progress: int = 3) -> list[bool]:
    decider = RestartDecider(max_no_progress)
    return [decider.decide(a.fingerprint(), a.reached).stop for a in attempts]


def test_the_labelled_set_has_at_least_forty_failures() -> None:
    assert len(DETERMINISTIC_STARTUP) + len(REPEATS) + len(TRANSIENT) >= 40


@pytest.mark.parametrize("name", sorted(DETERMINISTIC_STARTUP))
def test_a_deterministic_failure_before_the_first_step_stops_after_one_attempt(
    name: str,
) -> None:
    attempt = DETERMINISTIC_STARTUP[name]
    kind, _ = classify(attempt.fingerprint())
    assert kind is FailureKind.DETERMINISTIC
    assert run([attempt]) == [True]


@pytest.mark.parametrize("name", sorted(REPEATS))
def test_the_same_failure_at_the_same_iteration_stops_at_its_repeat(name: str) -> None:
    attempt = REPEATS[name]
    assert run([attempt, attempt]) == [False, True]


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_a_transient_failure_never_stops(name: str) -> None:
    attempt = TRANSIENT[name]
    assert classify(attempt.fingerprint())[0] is FailureKind.TRANSIENT
    assert run([attempt] * 6) == [False] * 6


def test_the_same_failure_at_another_iteration_restarts() -> None:
    assert run(
        [at_step("ValueError: bad batch 7", 10), at_step("ValueError: bad batch 9", 20)]
    ) == [
        False,
        False,
    ]


def test_deterministic_kinds_after_the_first_step_restart_once() -> None:
    """A ValueError at step 500 is not known to repeat: a restart, and a stop when it
    repeats there."""
    attempt = at_step("ValueError: sequence longer than 2048", 500)
    assert run([attempt, attempt]) == [False, True]


def test_unknown_first_step_never_stops_at_startup() -> None:
    """No heartbeat of the attempt: before the first step is unknown."""
    attempt = Attempt(error="ModuleNotFoundError: No module named 'x'", before_first_step=None)
    assert run([attempt]) == [False]
    assert run([attempt, attempt]) == [False, False]


def test_no_progress_stops_after_the_limit() -> None:
    """Different failures each time, none past the iteration reached before."""
    first = at_step("RuntimeError: a 1", 100)
    then = [
        Attempt(error=f"RuntimeError: other {c}", iteration=c, reached=c, stack=[])
        for c in ("alpha", "beta", "gamma")
    ]
    for a, it in zip(then, (90, 95, 99), strict=True):
        a.iteration = a.reached = it
    assert run([first, *then]) == [False, False, False, True]


def test_no_progress_off_and_progress_resets_the_count() -> None:
    a = [Attempt(error=f"RuntimeError: e{i}", reached=None, iteration=None) for i in "abcde"]
    assert run(a, max_no_progress=0) == [False] * 5
    seq = [
        Attempt(error="RuntimeError: a", reached=None),
        Attempt(error="RuntimeError: b", reached=None),
        Attempt(error="RuntimeError: c", reached=10, iteration=10),
        Attempt(error="RuntimeError: d", reached=None),
        Attempt(error="RuntimeError: e", reached=None),
        Attempt(error="RuntimeError: f", reached=None),
    ]
    assert run(seq) == [False, False, False, False, False, True]


def test_exclusion_by_restarts_takes_the_repeats() -> None:
    """Bad-node exclusion counting restarts: a repeated crash is the node's (exclusion
    acts); a deterministic start-up failure still stops."""
    repeat = REPEATS["value_at_step"]
    decider = RestartDecider(1, repeats=False)
    assert [decider.decide(repeat.fingerprint(), None).stop for _ in range(4)] == [False] * 4
    startup_error = DETERMINISTIC_STARTUP["module"]
    assert RestartDecider(repeats=False).decide(startup_error.fingerprint(), None).stop


def test_a_transient_failure_is_never_stopped_by_no_progress() -> None:
    kill = TRANSIENT["sigkill_startup"]
    assert run([kill] * 8, max_no_progress=2) == [False] * 8


def test_the_decision_line_names_the_fingerprint() -> None:
    decider = RestartDecider()
    decision = decider.decide(DETERMINISTIC_STARTUP["module"].fingerprint(), None)
    assert decision.rule is Rule.DETERMINISTIC_AT_STARTUP
    line = decision.line()
    assert line.startswith("stop, no restart: ModuleNotFoundError before the first step")
    assert decision.fingerprint.key in line
    assert "No module named 'not_a_module'" in line and "train.py:3:<module>" in line
    assert "\n" not in line
    record = decision.to_dict()
    assert record["decision"] == "stop" and record["fingerprint"]["key"] == decision.fingerprint.key


def test_normalisation_keeps_the_fault_and_drops_what_changes() -> None:
    a = normalise_message("boom at 0x7f3a2b10 in /tmp/run_123/x.bin rank 3 after 12.5 s")
    b = normalise_message("boom at 0xdeadbeef in /tmp/run_987/x.bin rank 1 after 7 s")
    assert a == b == "boom at <addr> in <path> rank <n> after <n> s"
    assert normalise_message("No module named 'foo_2'") == "No module named 'foo_2'"
    assert len(normalise_message("x " * 500) or "") == 200


def test_error_and_frames_are_parsed_from_the_traceback() -> None:
    stack = traceback(
        [
            ("/home/u/train.py", 10, "main"),
            (f"{SITE}/torch/nn/modules/module.py", 1, "call"),
            ("/home/u/model.py", 20, "forward"),
        ],
        "RuntimeError: shapes do not match",
    )
    assert user_frames(stack) == ("train.py:10:main", "model.py:20:forward")
    assert split_error(stack) == ("RuntimeError", "shapes do not match")
    assert split_error("torch.OutOfMemoryError: CUDA") == ("OutOfMemoryError", "CUDA")
    assert split_error("just text") == (None, "just text")
    assert split_error("omegaconf.errors.MissingMandatoryValue: optim.lr") == (
        "MissingMandatoryValue",
        "optim.lr",
    )
    assert split_error("KeyboardInterrupt") == ("KeyboardInterrupt", None)
    assert split_error("Killed") == (None, "Killed")
    assert split_error("error: unrecognized arguments: --x") == (
        None,
        "error: unrecognized arguments: --x",
    )


def test_the_fingerprint_key_ignores_pids_ranks_and_where() -> None:
    a = Fingerprint.build(error="ValueError: worker 12 pid 3345 bad", iteration=1, rank=0)
    b = Fingerprint.build(error="ValueError: worker 3 pid 99 bad", iteration=7, rank=5)
    c = Fingerprint.build(error="KeyError: worker 3 pid 99 bad", iteration=7, rank=5)
    assert a.key == b.key != c.key


def test_the_no_progress_key_and_nvrx_name() -> None:
    from rankguard.ft.config import FaultToleranceConfig

    assert FaultToleranceConfig().no_progress_limit == 3
    assert FaultToleranceConfig(max_no_progress_restarts=0).no_progress_limit == 0
    assert FaultToleranceConfig(max_no_progress_cycles=5).no_progress_limit == 5
    with pytest.raises(ValueError, match="max_no_progress_restarts"):
        FaultToleranceConfig(max_no_progress_restarts=-1)
    with pytest.raises(ValueError, match="max_no_progress_cycles"):
        FaultToleranceConfig(max_no_progress_cycles=-2)
