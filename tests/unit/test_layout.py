"""The layout's rules (docs/explanation/design.md, "How the code is laid out"), read from the source with ``ast``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "phalanx"
FLAG_TABLES = {"cli/parser.py:build_parser"}  # one add_argument call per flag: a table
MAX_FUNCTION_LINES = 45  # code lines, the docstring not counted
MAX_MODULE_LINES = 400  # all lines; a module past ~300 is asking to be split
MAX_LOOSE_MODULES = 6  # modules directly under src/phalanx/ (the entry points among them)
MAX_HANDLER_MEMBERS = 8  # rendezvous.api.RendezvousHandler's, as torch's handler

# The layers, top first (docs/explanation/design.md, "How the code is laid out", lists them in this order): a
# package imports only packages of the layers below its own. Records sit low (what a worker's
# exit is, the event log), views on them high (report, status, timeline). A row may name one
# module of a package ("nodecheck.settings"): it sits in its own layer, not its package's.
LAYERS: list[tuple[str, ...]] = [
    ("__main__", "__init__"),  # the entry points: ``python -m phalanx``, the in-script re-exports
    ("cli",),
    ("hosts",),  # many hosts over ssh, driven by the CLI
    ("inscript",),
    ("launch",),  # the one call both faces make: prepare(config).run(env)
    ("agent",),
    ("exclusion",),  # nodes kept out of the job: its streak reads the report's root cause
    ("status", "timeline"),
    ("report",),
    ("supervisor", "hang", "nodecheck", "stragglers"),
    ("service",),  # the warm service (--keep-warm): its process, key, client
    ("tick",),  # one reading of the ranks' progress per tick, fed to the watchers above
    ("plan",),
    ("rendezvous",),
    ("consistency", "events", "resources"),
    ("config", "errors", "parsing", "environments", "worker"),
    # Settings: plain data the config holds. A feature's own settings module (a dotted name)
    # sits here, below its package's other modules.
    ("hang.settings", "nodecheck.settings", "stragglers.settings"),
    ("version",),
]
TIER = {package: tier for tier, row in enumerate(LAYERS) for package in row}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), ast.parse(path.read_text())


def module_name(name: str) -> str:
    """``agent/loop.py`` -> ``phalanx.agent.loop``; ``agent/__init__.py`` -> ``phalanx.agent``."""
    return ".".join(["phalanx", *name.removesuffix(".py").split("/")]).removesuffix(".__init__")


MODULES = {module_name(name) for name, _ in modules()}


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imported_modules(tree: ast.Module) -> set[str]:
    """The phalanx modules a module imports, wherever in it (a function-level import too):
    ``from phalanx.agent import loop`` is ``phalanx.agent.loop``, ``from phalanx.agent import
    Agent`` is ``phalanx.agent`` (its ``__init__``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                found.add(whole if whole in MODULES else node.module)
    return found


def package_of(module: str) -> str:
    """The unit of ``LAYERS`` a module belongs to: ``phalanx.agent.loop`` -> ``agent``;
    ``phalanx.nodecheck.settings`` -> ``nodecheck.settings`` (named on its own); ``phalanx.launch``
    -> ``launch``; ``phalanx`` -> ``__init__`` (the package root)."""
    parts = module.split(".")[1:]
    for length in range(len(parts), 1, -1):
        if ".".join(parts[:length]) in TIER:
            return ".".join(parts[:length])
    return parts[0] if parts else "__init__"


def imported_packages(tree: ast.Module) -> set[str]:
    """The units of ``LAYERS`` a module imports (``from phalanx import parsing`` is ``parsing``)."""
    return {package_of(module) for module in imported_modules(tree)}


def test_every_package_has_a_layer() -> None:
    packages = {package_of(module_name(name)) for name, _ in modules()}
    assert sorted(packages - set(TIER)) == []
    assert sorted(set(TIER) - packages) == []


def test_imports_only_go_down_the_layers() -> None:
    upward = sorted(
        f"{name} imports {other} (layer {TIER[other]}, its own {TIER[own]})"
        for name, tree in modules()
        for own in [package_of(module_name(name))]
        for other in imported_packages(tree)
        if other != own and TIER[other] <= TIER[own]
    )
    assert upward == []


def test_the_docs_list_the_layers_in_their_order() -> None:
    text = (ROOT / "docs" / "explanation" / "design.md").read_text()
    block = text.split("## How the code is laid out", 1)[1].split("```", 2)[1]
    listed = [
        word.removesuffix("/").removesuffix(".py").replace("/", ".")
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
    assert long == [], "\n".join(long)


def test_no_test_fake_ships_in_src() -> None:
    """The in-memory store that drives the rendezvous tests lives in tests/support."""
    fakes = [
        f"{name}:{node.name}"
        for name, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name.startswith(("Memory", "Fake"))
    ]
    assert fakes == []


def test_few_loose_modules() -> None:
    """The top level holds the entry points and a few plain modules; every feature has a
    package that says what it is."""
    loose = sorted(path.name for path in SRC.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose


def test_modules_are_small() -> None:
    long = [
        f"{name} ({lines} lines)"
        for name in sorted(path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py"))
        for lines in [len((SRC / name).read_text().splitlines())]
        if lines > MAX_MODULE_LINES
    ]
    assert long == [], "\n".join(long)


def test_the_rendezvous_handler_is_small() -> None:
    """What a rendezvous is across rounds keeps at most 8 members, as torch's handler; what
    belongs to one round is on the round ``next_round`` returns (``rendezvous.api.Round``)."""
    tree = ast.parse((SRC / "rendezvous" / "api.py").read_text())
    (handler,) = [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "RendezvousHandler"
    ]
    members = [node.name for node in handler.body if isinstance(node, ast.FunctionDef)]
    assert len(members) <= MAX_HANDLER_MEMBERS, members


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_import_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    """Not even behind a function-level import: every import in a module is an edge."""
    graph = {
        module_name(name): imported_modules(tree) - {module_name(name)} for name, tree in modules()
    }
    assert import_circles(graph) == []
