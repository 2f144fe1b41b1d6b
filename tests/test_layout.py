"""The layout's rules (README, "How the code is laid out"), read from the source with ``ast``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "phalanx"
FLAG_TABLES = {"cli/parser.py:build_parser"}  # one add_argument call per flag: a table
MAX_FUNCTION_LINES = 60  # code lines, the docstring not counted


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), ast.parse(path.read_text())


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_only_the_cli_imports_the_cli() -> None:
    offenders = [
        name
        for name, tree in modules()
        if not name.startswith("cli/") and name != "__main__.py"
        if any(module.startswith("phalanx.cli") for module in imported(tree))
    ]
    assert offenders == []


def test_worker_side_code_imports_nothing_agent_side() -> None:
    offenders = {
        name: sorted(
            m
            for m in imported(tree)
            if m.startswith("phalanx.") and not m.startswith("phalanx.worker")
        )
        for name, tree in modules()
        if name.startswith("worker/")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_agent_side_code_never_imports_the_worker_boot() -> None:
    offenders = [
        name
        for name, tree in modules()
        if not name.startswith("worker/")
        if any(m.startswith("phalanx.worker.boot") for m in imported(tree))
    ]
    assert offenders == []


def test_functions_are_short() -> None:
    long = []
    for name, tree in modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                assert first.end_lineno is not None
                lines -= first.end_lineno - first.lineno + 1
            if lines > MAX_FUNCTION_LINES and f"{name}:{node.name}" not in FLAG_TABLES:
                long.append(f"{name}:{node.name} ({lines} lines)")
    assert long == []


def test_no_test_fake_ships_in_src() -> None:
    """The in-memory store that drives the rendezvous tests lives in tests/support."""
    fakes = [
        f"{name}:{node.name}"
        for name, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name.startswith(("Memory", "Fake"))
    ]
    assert fakes == []
