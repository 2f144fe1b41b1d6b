"""The error messages phalanx prints, read from the source with ``ast`` (no import, nothing
run), for the troubleshooting page and its test (``tests/test_docs.py``).

The rule, kept simple so it stays robust: a message is the first argument of
- ``raise E(...)`` where E is one of phalanx's errors (``PhalanxError`` and every class below it
  anywhere in src/, read from the class statements, so a new one is scanned without a list to
  keep: each is printed as ``phalanx: error: ...`` or ``phalanx: ...``), anywhere in src/;
- ``raise ValueError(...)`` in the modules that read the user's input (their ValueErrors are
  turned into usage errors: command line, environment, host lists, schedulers);
- ``problems.append(...)``: the lists of problems a usage error prints one line each.
Its *key* is its longest literal piece (an f-string's text between the ``{}``), whitespace
collapsed; a message with no literal piece of 12 characters or more is built elsewhere
and has no key. The troubleshooting page must contain every key.

    python docs/scripts/messages.py    # lists the messages the page lacks
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "phalanx"
PAGE = ROOT / "docs" / "troubleshooting.md"
ROOT_ERROR = "PhalanxError"
# Where a ValueError is the user's bad input (turned into a usage error by the caller).
INPUT_MODULES = ("cli/", "parsing.py", "hosts/", "environments/", "check_settings.py")
MIN_KEY = 12


def _pieces(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant)]
    if isinstance(node, ast.BinOp):
        return _pieces(node.left) + _pieces(node.right)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [p for e in node.elts for p in _pieces(e)]
    return []


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def error_classes(trees: list[ast.AST]) -> set[str]:
    """``PhalanxError`` and the classes that derive from it, directly or not."""
    bases = {
        node.name: {_name(b) for b in node.bases}
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    family = {ROOT_ERROR}
    while grown := {c for c, b in bases.items() if c not in family and b & family}:
        family |= grown
    return family


def _message_args(tree: ast.AST, input_module: bool, errors: set[str]) -> list[ast.expr]:
    found = []
    for node in ast.walk(tree):
        call = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            name = _name(node.exc.func)
            if name in errors or (input_module and name == "ValueError"):
                call = node.exc
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (
                node.func.attr == "append"
                and isinstance(owner, ast.Name)
                and owner.id == "problems"
            ):
                call = node
        if call is not None and call.args:
            found.append(call.args[0])
    return found


def messages() -> dict[str, str]:
    """key -> where (path:line), for every message with a key."""
    keys: dict[str, str] = {}
    trees = {
        p.relative_to(SOURCE).as_posix(): ast.parse(p.read_text())
        for p in sorted(SOURCE.rglob("*.py"))
    }
    errors = error_classes(list(trees.values()))
    for relative, tree in trees.items():
        for arg in _message_args(tree, relative.startswith(INPUT_MODULES), errors):
            pieces = [" ".join(p.split()) for p in _pieces(arg)]
            pieces = [p for p in pieces if len(p) >= MIN_KEY]
            if pieces:
                keys.setdefault(max(pieces, key=len), f"src/phalanx/{relative}:{arg.lineno}")
    return keys


def missing(page: str) -> dict[str, str]:
    """The messages the page does not hold (whitespace collapsed on both sides)."""
    text = " ".join(page.split())
    return {key: where for key, where in messages().items() if key not in text}


if __name__ == "__main__":
    for key, where in sorted(missing(PAGE.read_text()).items(), key=lambda kv: kv[1]):
        print(f"{where}: {key}")
