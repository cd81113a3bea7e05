"""The import layers of ``rankguard``, frozen: a module imports only from a lower layer
(or its own part). A new upward import, or a cycle between parts, fails here.

Parts are the folders of ``src/rankguard`` and the modules at its root; a folder is one
part whatever it holds (the folders say which process runs the code: ``rank/`` the
training process, ``relay/`` node k's launcher, ``monitor/`` node 0's). Imports under
``if TYPE_CHECKING:`` are annotations, not imports at run time, and are not counted;
imports inside functions are. The same list is in ``docs/architecture.md`` ("Layers").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankguard"

#: Bottom first. A part may import the parts of the layers below its own.
LAYERS: list[tuple[str, ...]] = [
    ("util",),
    ("schema",),
    ("scheduler", "health"),
    ("rank",),
    ("perf", "monitor", "view"),
    ("ft", "goodput", "rerun", "straggler", "live"),
    ("preempt", "relay", "exporter"),
    ("checkpoint", "inprocess", "layouts"),
    ("config",),
    ("session",),
    ("bootstrap",),
    ("rankguard", "integrations"),
    ("report", "launcher"),
    ("demo", "slurm"),
    ("cli",),
]

#: Upward imports that remain (importing module, imported part): none. Never to be added
#: to: a part that needs something from above takes it as an argument or a hook.
KNOWN_UPWARD: set[tuple[str, str]] = set()

_LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _part(module: str) -> str:
    """The part a ``rankguard`` module belongs to: its folder, or itself at the root."""
    names = module.split(".")
    return "rankguard" if len(names) == 1 else names[1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    """The ``rankguard`` modules a module imports at run time, with their lines."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rankguard":  # from rankguard import session
                for a in node.names:
                    sub = SRC / a.name
                    is_module = sub.is_dir() or sub.with_suffix(".py").is_file()
                    out.append((f"rankguard.{a.name}" if is_module else "rankguard", node.lineno))
            else:
                out.append((node.module, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(m, line) for m, line in out if m == "rankguard" or m.startswith("rankguard.")]


def _edges() -> list[tuple[str, str, str, int]]:
    """(importing module, its part, imported part, line) for every cross-part import."""
    edges = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        source = _part(module)
        for target_module, line in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            target = _part(target_module)
            if target != source:
                edges.append((module, source, target, line))
    return edges


def test_every_part_has_a_layer() -> None:
    parts = {_part(_module_name(p)) for p in SRC.rglob("*.py")}
    assert parts <= set(_LAYER), f"give these a layer in LAYERS: {sorted(parts - set(_LAYER))}"


def test_no_import_goes_up_a_layer() -> None:
    upward = [
        f"{module}:{line} imports {target} (layer {_LAYER[target]}) from layer {_LAYER[source]}"
        for module, source, target, line in _edges()
        if _LAYER[target] >= _LAYER[source] and (module, target) not in KNOWN_UPWARD
    ]
    assert upward == [], "\n".join(upward)


def test_the_parts_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for module, source, target, _ in _edges():
        if (module, target) not in KNOWN_UPWARD:
            graph.setdefault(source, set()).add(target)
    done: set[str] = set()

    def walk(part: str, path: tuple[str, ...]) -> None:
        if part in path:
            pytest.fail("import cycle: " + " -> ".join((*path[path.index(part) :], part)))
        if part in done:
            return
        for nxt in sorted(graph.get(part, ())):
            walk(nxt, (*path, part))
        done.add(part)

    for part in sorted(graph):
        walk(part, ())


def test_the_checker_sees_an_upward_import() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rankguard.cli import main\n"
        "def f():\n    from rankguard.launcher import run\n"
        "from rankguard import session\n"
    )
    assert [m for m, _ in _imports(tree)] == ["rankguard.launcher", "rankguard.session"]
    assert _part("rankguard.relay.relay") == "relay"
    assert _part("rankguard.monitor.rules") == "monitor"
    assert _part("rankguard") == "rankguard"


def test_finding_is_built_in_one_place() -> None:
    """Every finding comes from ``Finding.build`` (and ``from_dict`` reading one back)."""
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "schema" / "findings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Name) and func.id == "Finding":
                calls.append(f"{path.relative_to(SRC)}:{node.lineno}")  # type: ignore[attr-defined]
    assert calls == []
