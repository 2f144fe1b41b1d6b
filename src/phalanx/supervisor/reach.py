"""Whether a job's program may import torch, read from its source without running any of it.

The warm-start template imports torch only for a program that would (``supervisor.warm``):
about 1 s of CPU per node and per launch that a program which never touches torch (a test
script that sleeps, a data tool, a shell-like helper) would otherwise pay for nothing. This
module reads the entrypoint -- the script, or the ``-m`` module found as python would find it
but without importing anything -- with ``ast``, and follows every import of the user's own
modules: files found in the directories the worker's ``sys.path`` starts with (the script's
directory, or the working directory for ``-m``; then ``PYTHONPATH``). An import of the
standard library (``sys.stdlib_module_names``) ends the path there; phalanx's own modules are
read like the user's (its lazy names, ``phalanx.step`` and the like, by the module behind the
name used). Imports anywhere in a file count (inside a function too); only an
``if TYPE_CHECKING:`` block, which never runs, does not.

It answers "may import torch" for anything it cannot prove free of it: torch itself, a
module that is neither the user's nor the standard library's (an installed package), a
compiled or source-less module, a file it cannot read or parse, ``exec``/``eval``/``compile``,
an ``import_module``/``__import__`` of a name that is not a literal, a standard module that
imports by data (``pickle``, ``runpy``, ``importlib.util``...), a relative import outside a
package, a file over ``MAX_BYTES``, or a scan past ``MAX_FILES`` files or ``MAX_SECONDS``.
Being wrong the other way costs only time: a worker that imports torch after all pays its
own import, as a cold worker (and every torchrun worker) does. Nothing is cached: each agent
run reads afresh.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

TARGET = "torch"
MAX_FILES = 200
MAX_BYTES = 1 << 20  # one file: parsing a generated module of many MB alone would pass the time
MAX_SECONDS = 0.25  # the template starts after the scan: it must stay far below a torch import
# Standard modules that import modules named in data or run code from other files.
RUN_OTHER_CODE = frozenset(
    {"runpy", "pickle", "shelve", "pkgutil", "marshal", "zipimport", "code", "codeop", "pydoc",
     "importlib.util"}
)  # fmt: skip
# The order python's path finder tries them in: compiled code first, then source, then bytecode.
SUFFIXES = (
    *importlib.machinery.EXTENSION_SUFFIXES,
    *importlib.machinery.SOURCE_SUFFIXES,
    *importlib.machinery.BYTECODE_SUFFIXES,
)
DYNAMIC_CALLS = frozenset({"exec", "eval", "compile"})
IMPORT_CALLS = frozenset({"__import__", "import_module"})
# Where the installed phalanx is imported from (``src/`` of a checkout, or site-packages).
PHALANX_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Reach:
    """The scan's answer: ``may`` import torch, and why, in words for the log."""

    may: bool
    why: str


class _May(Exception):
    """Ends the scan: the program may import torch (the message says why)."""


def may_import_torch(kind: str, target: str, cwd: str, env: Mapping[str, str]) -> Reach:
    """Whether ``python -u TARGET`` (``kind`` "script") or ``python -u -m TARGET`` ("module"),
    run in ``cwd`` with ``env``, may import torch. Never raises."""
    safe = bool(env.get("PYTHONSAFEPATH"))  # python then prepends nothing to sys.path
    extra = [os.path.join(cwd, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    scan = _Scan(time.monotonic() + MAX_SECONDS)
    try:
        if kind == "script":
            script = Path(cwd, target)
            scan.roots = ([] if safe else [script.resolve().parent]) + [Path(p) for p in extra]
            if not script.is_file():
                raise _May(f"{target} is not a file")
            scan.queue.append((script, "__main__", False))
        else:
            scan.roots = ([] if safe else [Path(cwd)]) + [Path(p) for p in extra]
            main = scan.resolve(target, "-m") + scan.resolve(f"{target}.__main__", "-m")
            scan.queue.extend(main)
        files = scan.run()
    except _May as why:
        return Reach(True, str(why))
    # A path or a tree too odd to follow (or a bug here) costs a torch import, never the launch.
    except Exception as exc:
        return Reach(True, f"the scan of {target} failed: {type(exc).__name__}: {exc}")
    return Reach(False, f"{target} never imports {TARGET} ({files} files read)")


class _Scan:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.roots: list[Path] = []
        self.queue: list[tuple[Path, str, bool]] = []  # file, module name, is a package
        self.seen: set[Path] = set()

    def run(self) -> int:
        while self.queue:
            path, name, package = self.queue.pop()
            if path in self.seen:
                continue  # a cycle, or a module imported twice
            self.seen.add(path)
            if len(self.seen) > MAX_FILES or time.monotonic() > self.deadline:
                raise _May(f"stopped after {len(self.seen) - 1} files")
            for imported in _imports(path, name, package):
                self.queue.extend(self.resolve(imported, str(path)))
        return len(self.seen)

    def resolve(self, name: str, by: str) -> list[tuple[Path, str, bool]]:
        """The files importing ``name`` runs (its packages' ``__init__`` first); [] for the
        standard library or an attribute of a package; ``_May`` when it cannot tell."""
        parts = name.split(".")
        if parts[0] == TARGET:
            raise _May(f"{by} imports {name}")
        if name in RUN_OTHER_CODE or parts[0] in RUN_OTHER_CODE:
            raise _May(f"{by} imports {name}, which can import any module")
        dirs = self.roots
        files: list[tuple[Path, str, bool]] = []
        for depth, part in enumerate(parts):
            found = _locate(dirs, part)
            if found is None and depth == 0:
                if parts[0] == "phalanx" and dirs is self.roots:
                    dirs = [PHALANX_ROOT]
                    found = _locate(dirs, part)
                if found is None and parts[0] in sys.stdlib_module_names:
                    return []
                if found is None:
                    raise _May(
                        f"{by} imports {name}, not in the standard library nor a file of yours"
                    )
            if found is None:
                return files  # an attribute (``from pkg import name``), or python's ImportError
            init, dirs = found
            if init is not None:
                files.append((init, ".".join(parts[: depth + 1]), bool(dirs)))
        return files


def _locate(dirs: list[Path], part: str) -> tuple[Path | None, list[Path]] | None:
    """Where ``part`` is in ``dirs``, as python's path finder looks: (the file to read or None
    for a namespace package, the directories a package's submodules are looked for in)."""
    namespace: list[Path] = []
    for directory in dirs:
        package = directory / part
        if package.is_dir():
            for suffix in SUFFIXES:
                if (package / f"__init__{suffix}").is_file():
                    return _source(package / f"__init__{suffix}"), [package]
        for suffix in SUFFIXES:
            if (directory / f"{part}{suffix}").is_file():
                return _source(directory / f"{part}{suffix}"), []
        if package.is_dir():
            namespace.append(package)
    return (None, namespace) if namespace else None


def _source(path: Path) -> Path:
    if path.suffix not in importlib.machinery.SOURCE_SUFFIXES:
        raise _May(f"{path} is compiled code, which cannot be read")
    return path


def _imports(path: Path, name: str, package: bool) -> Iterator[str]:
    """The absolute names of every module ``path`` may import."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise _May(f"{path} is over {MAX_BYTES} bytes")
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, OSError) as exc:
        raise _May(f"{path} cannot be parsed ({exc})") from exc
    here = name if package else name.rpartition(".")[0]
    lazy = _phalanx_lazy() if any(_uses_phalanx(n) for n in ast.walk(tree)) else {}
    for node in _runs(tree, skip_getattr=name == "phalanx" and path.is_relative_to(PHALANX_ROOT)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
                if alias.name == "phalanx":
                    yield from _lazy_used(tree, alias.asname or "phalanx", lazy)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, here, path)
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"  # a submodule, if there is one of that name
                if base == "phalanx":
                    yield from lazy.get(alias.name, ())
        elif isinstance(node, ast.Call):
            yield from _called(node, path)


def _runs(tree: ast.AST, skip_getattr: bool) -> Iterator[ast.AST]:
    """Every node that may run: not an ``if TYPE_CHECKING:`` body, and not phalanx's own
    lazy ``__getattr__`` (its names are followed by the name used instead)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (n for child in node.orelse for n in _runs_with(child, skip_getattr))
            continue
        if skip_getattr and isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            continue
        yield from _runs_with(node, False)


def _runs_with(node: ast.AST, skip_getattr: bool) -> Iterator[ast.AST]:
    yield node
    yield from _runs(node, skip_getattr)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(node: ast.ImportFrom, here: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    parts = here.split(".") if here else []
    if not here or node.level - 1 > len(parts) - 1:
        raise _May(f"{path} has a relative import outside a package")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _called(node: ast.Call, path: Path) -> Iterator[str]:
    func = node.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if called in DYNAMIC_CALLS and isinstance(func, ast.Name):
        raise _May(f"{path} calls {called}")
    if called in IMPORT_CALLS:
        first = node.args[0] if node.args else None
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            raise _May(f"{path} calls {called} with a name that is not a literal")
        yield first.value


def _uses_phalanx(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name == "phalanx" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and node.module == "phalanx" and not node.level


def _phalanx_lazy() -> dict[str, tuple[str, ...]]:
    """phalanx's lazy names (``step``, ``checkpoint``...) -> the module each imports, read from
    its ``__init__``'s ``_LAZY`` and ``_MODULES`` tables."""
    tree = ast.parse((PHALANX_ROOT / "phalanx" / "__init__.py").read_bytes())
    lazy: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] in (
            ["_LAZY"],
            ["_MODULES"],
        ):
            for key, value in ast.literal_eval(node.value).items():
                lazy[str(key)] = (str(value),)
    return lazy


def _lazy_used(tree: ast.AST, alias: str, lazy: dict[str, tuple[str, ...]]) -> Iterator[str]:
    """The modules behind the lazy names read as ``alias.NAME``; all of them if ``alias`` is
    used any other way (passed on, ``getattr``)."""
    reads = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == alias
    ]
    uses = sum(1 for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == alias)
    for name in lazy if uses > len(reads) else set(reads):
        yield from lazy.get(name, ())
