"""The layout's rules (docs/explanation/design.md, "How the code is laid out"), read from the source with ``ast``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "phalanx"
FLAG_TABLES = {"cli/parser.py:build_parser"}  # one add_argument call per flag: a table
MAX_FUNCTION_LINES = 60  # code lines, the docstring not counted

# The layers, top first (docs/explanation/design.md, "How the code is laid out", lists them in this order): a
# package imports only packages of the layers below its own. Records sit low (what a worker's
# exit is, the event log), views on them high (report, status, timeline).
LAYERS: list[tuple[str, ...]] = [
    ("__main__", "__init__"),  # the entry points: ``python -m phalanx``, the in-script re-exports
    ("cli",),
    ("hosts",),  # many hosts over ssh, driven by the CLI
    ("inscript",),
    ("launch",),  # the one call both faces make: prepare(config).run(env)
    ("agent",),
    ("status", "timeline"),
    ("report",),
    ("supervisor", "hang", "nodecheck"),
    ("plan",),
    ("rendezvous",),
    ("consistency", "events", "limits", "rundir"),
    ("config", "errors", "credentials", "net", "parsing", "environments", "worker"),
    ("check_settings", "straggler_settings"),  # settings: plain data the config holds
    ("signals", "version"),
]
TIER = {package: tier for tier, row in enumerate(LAYERS) for package in row}


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


def package_of(module: str) -> str:
    """``phalanx.agent.loop`` -> ``agent``; ``phalanx.launch`` -> ``launch``; ``phalanx`` ->
    ``__init__`` (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_packages(tree: ast.Module) -> set[str]:
    """The phalanx packages a module imports (``from phalanx import parsing`` is ``parsing``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(package_of(a.name) for a in node.names if a.name.startswith("phalanx"))
        elif isinstance(node, ast.ImportFrom) and node.module == "phalanx":
            for alias in node.names:
                own = (SRC / alias.name).is_dir() or (SRC / f"{alias.name}.py").exists()
                found.add(alias.name if own else "__init__")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("phalanx."):
            found.add(package_of(node.module or ""))
    return found


def test_every_package_has_a_layer() -> None:
    packages = {
        package_of("phalanx." + name.split("/")[0].removesuffix(".py")) for name, _ in modules()
    }
    assert sorted(packages - set(TIER)) == []
    assert sorted(set(TIER) - packages) == []


def test_imports_only_go_down_the_layers() -> None:
    upward = sorted(
        f"{name} imports {other} (layer {TIER[other]}, its own {TIER[own]})"
        for name, tree in modules()
        for own in [package_of("phalanx." + name.split("/")[0].removesuffix(".py"))]
        for other in imported_packages(tree)
        if other != own and TIER[other] <= TIER[own]
    )
    assert upward == []


def test_the_docs_list_the_layers_in_their_order() -> None:
    text = (ROOT / "docs" / "explanation" / "design.md").read_text()
    block = text.split("## How the code is laid out", 1)[1].split("```", 2)[1]
    listed = [
        word.removesuffix("/").removesuffix(".py")
        for line in block.splitlines()[2:]
        if line.startswith("  ") and not line.startswith("    ") and line.strip()
        for word in line.split("  ")[1].split()
        if word.endswith(("/", ".py"))
    ]
    expected = [p for row in LAYERS for p in row if not p.startswith("__")]
    assert listed == expected


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
