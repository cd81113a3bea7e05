"""What held when the trust boundaries were last reviewed, kept holding: no shell, no
``eval``, no code-running load anywhere in the package; a configuration file cannot
build Python objects; Prometheus label values are escaped whatever a record says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rankguard.config import ConfigError, load_config

SRC = Path(__file__).resolve().parents[2] / "src" / "rankguard"

#: ``exec`` runs the user's own training script, as ``runpy`` would (``--run-path``).
EXEC_ALLOWED = {"launcher/worker.py"}


def _calls() -> list[tuple[str, ast.Call]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(SRC).as_posix()
        out += [(rel, node) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return out


def _name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else "?"
        return f"{base}.{f.attr}"
    return "?"


def test_no_shell_eval_or_code_running_load_in_the_package() -> None:
    calls = _calls()
    assert len(calls) > 1000  # the scan saw the package
    bad = []
    for rel, call in calls:
        name = _name(call)
        where = f"{rel}:{call.lineno} {name}"
        for kw in call.keywords:
            if kw.arg == "shell" and not (
                isinstance(kw.value, ast.Constant) and kw.value.value is False
            ):
                bad.append(f"{where}: shell=")
        if name in ("eval", "builtins.eval"):
            bad.append(f"{where}: eval")
        if name == "exec" and rel not in EXEC_ALLOWED:
            bad.append(f"{where}: exec")
        if name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
            bad.append(f"{where}: a YAML loader that builds objects")
        if name == "torch.load":
            safe = any(
                kw.arg == "weights_only"
                and isinstance(kw.value, ast.Constant)
                and kw.value.value is True
                for kw in call.keywords
            )
            if not safe:
                bad.append(f"{where}: torch.load without weights_only=True")
    assert not bad, bad


@pytest.mark.parametrize(
    "text",
    [
        'heartbeat: !!python/object/apply:os.mkdir ["{marker}"]\n',
        "heartbeat: !!python/name:os.system\n",
        'heartbeat: !!python/object/new:os.mkdir ["{marker}"]\n',
    ],
)
def test_a_config_file_cannot_build_python_objects(tmp_path: Path, text: str) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "config.yaml"
    path.write_text(text.format(marker=marker), encoding="utf-8")
    with pytest.raises(ConfigError):
        load_config(path)
    assert not marker.exists()


def test_prometheus_label_values_are_escaped() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rankguard.exporter.collector import build_families

    host = 'h"\\\n} evil{x="1"} 1\n#'
    status = {
        "run_id": 'run"\n',
        "state": "running",
        "ranks": [{"rank": 0, "hostname": host, "iteration": 3, "process_liveness": "alive"}],
    }
    families = build_families(
        status, scans=1, scan_errors=0, last_scan_s=0.01, finding_counts={}, now_wall=0.0
    )

    class _Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(families)

    registry = CollectorRegistry()
    registry.register(_Fixed())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    parsed = list(text_string_to_metric_families(text))
    samples = [s for fam in parsed for s in fam.samples]
    assert samples and not any(s.name.startswith("evil") for s in samples)
    assert {s.labels["run_id"] for s in samples} == {'run"\n'}
    hosts = {s.labels.get("Hostname") or s.labels.get("hostname") for s in samples}
    assert host in hosts, hosts
