"""NVRx 0.7's ``ft_launcher`` flags on ``rankguard run``: with NVRx 0.7.0's own parser
and ``FaultToleranceConfig.from_args`` (a child process that imports the release, see
tests/nvrx_release.py) every flag 0.7 defines is accepted, mapped or one line saying
why it has no effect; with the installed NVRx (0.4.1) the frozen list accepts them too."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rankguard.cli.main import _nvrx_flags
from rankguard.config import load_config
from rankguard.ft.launcher_flags import FROZEN, FT_ON, MAPPED, NO_EFFECT, NODE_HEALTH
from rankguard.launcher.options import parse_run_args
from tests.nvrx_release import VERSION, release_env, release_path

pytestmark = pytest.mark.timeout(120)

# a value 0.7's parser takes for each flag (default: 400, a number every timeout takes)
_SAMPLES = {
    "ft_cfg_path": None,  # a file: written by the child
    "ft_rank_section_timeouts": "setup:600,step:180,checkpointing:420",
    "ft_rank_termination_signal": "SIGTERM",
    "ft_log_level": "INFO",
    "ft_attribution_log_level": "INFO",
    "ft_restart_policy": "any-failed",
    "ft_rdzv_impl": "barrier",
    "ft_attribution_analysis_backend": "lib",
    "ft_attribution_stop_action": "log",
    "ft_attribution_endpoint": "http://localhost:8000",
    "ft_attribution_llm_base_url": "http://localhost:8001",
    "ft_attribution_export_url": "http://localhost:8002/export",
    "ft_attribution_llm_model": "some-model",
    "ft_per_cycle_applog_prefix": "TMP/applog",
    "ft_nvrx_logfile": "TMP/nvrx.log",
    "ft_log_server_log_prefix": "TMP/logsrv",
    "ft_cycle_info_dir": "TMP/nvrx",
    "ft_segment_health_check_dir": "TMP/seg",
    "ft_storage_healthcheck_path": "TMP",
    "ft_checkpoint_iteration_file": "TMP/latest_checkpointed_iteration.txt",
    "ft_attribution_llm_api_key_file": "TMP/key",
    "ft_pci_topo_file": "TMP/topo.xml",
    "ft_link_down_path_template": "TMP/{dev_name}",
    "ft_link_state_path_template": "TMP/{dev_name}",
    "ft_node_health_check_endpoint": "unix:///tmp/nvhcd.sock",
    "ft_ignore_missing_cfg": "SWITCH",
}
_BOOLS = (
    "enable_nic_monitor",
    "enable_nic_healthcheck",
    "enable_dist_storage_healthcheck",
    "enable_log_server",
    "skip_section_response",
    "numa_bind_strict",
    "check_remaining_processes",
    "install_exception_hook",
)

_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from pathlib import Path

    from rankguard.cli.main import _nvrx_flags
    from rankguard.config import load_config
    from rankguard.ft.launcher_flags import launcher_flags
    from rankguard.launcher.options import parse_run_args

    tmp, samples = sys.argv[1], json.loads(sys.argv[2])
    cfg_file = Path(tmp) / "ft.yaml"
    cfg_file.write_text("fault_tolerance:\\n  rank_heartbeat_timeout: 200\\n")
    flags, source = launcher_flags()
    out = {"source": source, "flags": []}
    for flag in flags:
        value = samples.get(flag.dest, "400")
        value = str(cfg_file) if flag.dest == "ft_cfg_path" else value.replace("TMP", tmp)
        for option in flag.options:
            words = [option] if value == "SWITCH" else [f"{option}={value}"]
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                argv = _nvrx_flags(["run", "--nproc-per-node", "2", *words, "train.py"])
                _opts, overrides = parse_run_args(argv[1:])
                load_config(None, overrides)
            out["flags"].append({
                "dest": flag.dest, "option": option, "tail": argv[-1],
                "sets": [w for w in argv if w.startswith(("fault_tolerance.", "node_health."))],
                "err": err.getvalue().strip().splitlines(),
            })
    # a value 0.7's parser refuses, through the command line's own entry point
    from rankguard.cli.main import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(
                ["run", "--nproc-per-node", "1", "--ft-restart-policy=min-healthy", "train.py"]
            )
        except SystemExit as exc:
            code = exc.code
    out["refused"] = {"code": code, "stderr": err.getvalue()}
    print(json.dumps(out))
    """
)


def _samples() -> dict[str, str | None]:
    out: dict[str, str | None] = dict(_SAMPLES)
    out.update({f"ft_{name}": "true" for name in _BOOLS})
    return out


def test_every_nvrx_07_flag_is_accepted_with_its_meaning_and_a_refused_value_is_one_line(
    tmp_path: Path,
) -> None:
    """Each flag in NVRx 0.7.0's parser, then (in the same child: one interpreter that
    imports the release) a value that parser refuses: 0.7 takes only ``any-failed`` as
    the restart policy, so ``rankguard run --ft-restart-policy=min-healthy`` is refused
    in one line (exit 2) before anything is launched, not by argparse's usage and exit
    from inside the flag translation."""
    path = release_path()
    src = Path(__file__).resolve().parents[3] / "src"
    env = release_env(path)
    env["PYTHONPATH"] = f"{path}:{src}"
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), json.dumps(_samples())],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["source"] == f"nvidia-resiliency-ext {VERSION} (its launcher's parser)"
    frozen = {o for f in FROZEN for o in f.options}
    options = {r["option"] for r in out["flags"]}
    # the frozen list (used without NVRx, and to accept 0.7's spellings under 0.4.1)
    # holds every 0.7 flag
    assert options <= frozen, sorted(options - frozen)
    for name in ("--ft-segment", "--ft-cycle-info-dir", "--ft-no-restart-exit-code"):
        assert name in options
    assert any(o.startswith("--ft-attribution-") for o in options)
    assert "--ft-max-no-progress-cycles" in options
    for r in out["flags"]:
        assert r["tail"] == "train.py", r
        name = r["dest"].removeprefix("ft_")
        if name in MAPPED:
            assert r["sets"] and not r["err"], r
        elif name == "cfg_path":
            assert r["sets"] == [FT_ON, "fault_tolerance.rank_heartbeat_timeout=200"], r
        elif name == "restart_policy":  # any-failed: rankguard's own behaviour
            assert r["sets"] == [FT_ON] and not r["err"], r
        elif name in NODE_HEALTH:  # rankguard's node checks before each round
            assert "node_health.enabled=true" in r["sets"] and not r["err"], r
        else:  # one line, with the reason
            assert name in NO_EFFECT, r
            assert len(r["err"]) == 1 and NO_EFFECT[name] in r["err"][0], r
    refused = out["refused"]
    assert refused["code"] == 2, refused["stderr"][-3000:]
    assert "usage:" not in refused["stderr"], refused["stderr"][-3000:]
    ours = [ln for ln in refused["stderr"].splitlines() if ln.startswith("rankguard run:")]
    assert len(ours) == 1, refused["stderr"][-3000:]
    assert "--ft-restart-policy" in ours[0] and "min-healthy" in ours[0], ours


@pytest.mark.parametrize(
    "words",
    [
        ["--ft-segment=4"],
        ["--ft-no-restart-exit-code", "42"],
        ["--ft-cycle-info-dir=/tmp/nvrx"],
        ["--ft-attribution-endpoint=http://localhost:8000"],
        ["--ft-ignore-missing-cfg"],
    ],
)
def test_nvrx_07_flags_are_accepted_under_an_older_nvrx(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _nvrx_flags(["run", "--nproc-per-node", "2", *words, "train.py", "--lr", "1"])
    assert argv[-3:] == ["train.py", "--lr", "1"]
    _opts, overrides = parse_run_args(argv[1:])
    load_config(None, overrides)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no effect under rankguard: " in err[0], err


def test_nvrxs_no_progress_limit_is_rankguards_restart_or_stop_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _nvrx_flags(
        ["run", "--nproc-per-node", "2", "--ft-max-no-progress-cycles=2", "train.py"]
    )
    _opts, overrides = parse_run_args(argv[1:])
    cfg = load_config(None, overrides)
    assert cfg.fault_tolerance.no_progress_limit == 2
    assert capsys.readouterr().err.strip() == ""  # it takes effect: no line
