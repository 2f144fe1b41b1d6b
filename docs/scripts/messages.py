"""The messages phalanx prints to the user, read from the source with ``ast`` (no import,
nothing run), for the troubleshooting page and its test (``tests/project/test_docs.py``).

What counts as a message, kept to rules so a new one is scanned without a list to keep:
- the first argument of ``raise E(...)`` where E is one of phalanx's errors (``PhalanxError``
  and every class below it anywhere in src/, read from the class statements; each is printed
  as ``phalanx: error: ...`` or ``phalanx: ...``), or a store's (``StoreUnavailable`` and its
  family: printed after ``--rdzv-backend NAME: `` or ``rendezvous: ``);
- an error class that words its own message (``super().__init__(f"...")`` in its
  ``__init__``): that message, once, and not the arguments of each ``raise``;
- ``raise f(...)`` where ``f`` is a function of phalanx that returns one of those errors:
  the message of each error it returns;
- ``raise ValueError(...)`` and ``raise argparse.ArgumentTypeError(...)`` in the modules that
  read the user's input (turned into usage errors: command line, environment, host lists,
  schedulers);
- ``problems.append(...)``, and ``p.add(...)`` on a parameter annotated ``Problems``: the
  lists of problems a usage error prints one line each;
- ``log.warning(...)`` and ``log.error(...)``: the warnings and errors on stderr.

A message given by name is followed to where its text is made: a local variable to its
assignments (and its ``append``s, and the list a ``for`` takes it from), a call of a function
of phalanx to that function's ``return`` values, an attribute (``decision.failure``) to the
values given to that name (``failure=...``, ``x.failure = ...``) anywhere in src/. Each value
found is a message of its own. Its *key* is its longest literal piece (an f-string's text
between the ``{}``, a ``%`` format's text between its fields), whitespace collapsed, of at
least 12 characters; with the words the message starts with (8 characters or more) when they
are not in that piece: the page must hold them before it, in the same entry
("--signals-to-handle: … cannot be caught" is not "--preempt-signals: … cannot be caught"). The troubleshooting page must contain every key; a message with no key
(its text is the operating system's, or a signal's) must be in ``UNKEYED`` with the reason.

    python docs/scripts/messages.py    # lists the messages the page lacks, and unkeyed ones
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "phalanx"
PAGE = ROOT / "docs" / "troubleshooting.md"
ROOT_ERRORS = ("PhalanxError", "StoreUnavailable")
INPUT_ERRORS = ("ValueError", "ArgumentTypeError")
# Where a ValueError is the user's bad input (turned into a usage error by the caller).
INPUT_MODULES = ("cli/", "parsing.py", "hosts/", "environments/", "nodecheck/settings.py")
LOG_LEVELS = ("warning", "error")
MIN_KEY = 12
MIN_PREFIX = 8  # a message's first words this long are part of its key (``_key``)
SIGNAL = "Interrupted(signal): worded by the class from the signal ('stopped by SIGTERM')"
STORE = "the store's own error (a refused connection, an etcd reply), after 'rendezvous: '"
FIELD = "\0"  # where a value is filled in at run time (shown as … on the page)
DEPTH = 7
PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfgixX%]")

# Messages whose text no scan can read, and why ("module: argument" as ``ast.unparse`` shows
# it; no line numbers, which any edit above would move).
# The test fails on a keyless message that is not here, and on an entry no longer found.
UNKEYED: dict[str, str] = {
    "agent/endings.py: signum": SIGNAL,
    "agent/endings.py: signal.Signals[preemption.signal]": SIGNAL,
    "supervisor/signals.py: signum": SIGNAL,
    "supervisor/signals.py: self._received[0]": SIGNAL,
    "supervisor/signals.py: self._preempts[0]": SIGNAL,
    "environments/slurm.py: Problem(f'slurm: {exc}', ('master_addr',))": "python-hostlist's "
    "own error for a malformed SLURM nodelist, after 'slurm: '",
    "hosts/run.py: str(exc)": "the operating system's error starting ssh (e.g. no such file)",
    "rendezvous/backends/c10d.py: str(exc)": "torch's TCPStore's error connecting",
    "rendezvous/dynamic/beat.py: ('rendezvous: %s', exc)": STORE,
    "rendezvous/dynamic/liveness.py: ('rendezvous: %s', exc)": STORE,
    "rendezvous/dynamic/exchange.py: problem": "the liveness's store_problem(), passed in as "
    "a callable: its lines are scanned where liveness words them",
    "rendezvous/dynamic/assembly.py: f\"round {t}: {found['fail']}\"": "the failure another "
    "node wrote to the store, worded (and scanned) where it is written",
    "cli/convert.py: problem": "straggler_problems()'s lines, scanned where they are appended",
}
# Texts the scan meets on the way to a message that are not messages themselves (help text
# of --rdzv-backend, reached through an attribute with the same name as a message's).
NOT_MESSAGES = {
    "etcd v3 (torchrun's etcd-v2 name accepted)",
    "the agent store, hosted by one agent",
    "node ranks given; node 0 hosts the store",
    # The store's name that starts a store error built only of values
    # (``f"{self.where}: {request}: {why}"``), and a text met through ``why``'s attribute.
    "the rendezvous store at",
    "the rendezvous store this node hosts on",
    "the rendezvous store this node hosts on port",
    "no Python stack",
}

Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Module
T = TypeVar("T")
Index = dict[tuple[str, str], list[T]]  # (module, name) -> what is found there


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def error_classes(trees: list[ast.AST]) -> set[str]:
    """``ROOT_ERRORS`` and the classes that derive from them, directly or not."""
    bases = {
        node.name: {_name(b) for b in node.bases}
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    family = set(ROOT_ERRORS)
    while grown := {c for c, b in bases.items() if c not in family and b & family}:
        family |= grown
    return family


def _scopes(tree: ast.Module) -> Iterator[tuple[ast.AST, Scope]]:
    """Every node with the innermost function (or the module) it stands in."""
    stack: list[tuple[ast.AST, Scope]] = [(tree, tree)]
    while stack:
        node, scope = stack.pop()
        yield node, scope
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


class Source:
    """src/phalanx read once: its functions, calls, and the values given to each attribute
    name, by module (a method or an attribute is looked up in its own module first: names
    like ``add`` or ``found`` mean other things elsewhere)."""

    def __init__(self) -> None:
        self.trees = {
            p.relative_to(SOURCE).as_posix(): ast.parse(p.read_text())
            for p in sorted(SOURCE.rglob("*.py"))
        }
        self.errors = error_classes(list(self.trees.values()))
        self.worded = worded_classes(list(self.trees.values()), self.errors)
        self._tree: dict[int, ast.Module] = {
            id(node): tree for tree in self.trees.values() for node in ast.walk(tree)
        }
        self.module_of: dict[int, str] = {}
        self.functions: Index[ast.FunctionDef | ast.AsyncFunctionDef] = defaultdict(list)
        self.attributes: Index[tuple[ast.expr, Scope]] = defaultdict(list)
        self.calls: Index[tuple[ast.Call, Scope]] = defaultdict(list)
        # The errors made in a ``raise`` (``_raised`` reads them; ``_made`` the others).
        self.raised = {
            id(node.exc)
            for tree in self.trees.values()
            for node in ast.walk(tree)
            if isinstance(node, ast.Raise) and node.exc is not None
        }
        # A record's fields in order, so ``Named(rank, host, addr, line)`` gives ``line``.
        self.fields = {
            node.name: [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
            for tree in self.trees.values()
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
        }
        # The names a module binds to a builtin container (``self.seen = set()``): a call of
        # ``seen.add(x)`` there is the set's, never a phalanx method of that name.
        self.containers = {
            (module, _name(target))
            for module, tree in self.trees.items()
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _builds_container(node)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        }
        for module, tree in self.trees.items():
            self.module_of[id(tree)] = module
            for node, scope in _scopes(tree):
                self._index(module, node, scope)

    def tree_of(self, node: ast.AST) -> ast.Module:
        """The module ``node`` stands in."""
        return self._tree[id(node)]

    def _index(self, module: str, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.module_of[id(node)] = module
            self.functions[module, node.name].append(node)
        elif isinstance(node, ast.Call):
            self.calls[module, _name(node.func)].append((node, scope))
            for name, arg in zip(self.fields.get(_name(node.func), []), node.args, strict=False):
                self.attributes[module, name].append((arg, scope))
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("append", "extend")
                and isinstance(func.value, ast.Attribute)
                and node.args
            ):  # self.found.append(text)
                self.attributes[module, func.value.attr].append((node.args[0], scope))
        elif isinstance(node, ast.keyword) and node.arg:
            self.attributes[module, node.arg].append((node.value, scope))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    self.attributes[module, target.attr].append((node.value, scope))

    def _lookup(self, index: Index[T], module: str, name: str, local: bool) -> list[T]:
        """``name`` in ``module``; a plain function's name, or one ``module`` lacks, anywhere."""
        found = index.get((module, name), [])
        if found or local:
            return found
        return [v for (_, n), values in index.items() if n == name for v in values]

    def texts(self, node: ast.expr, scope: Scope, depth: int = 0) -> list[list[str]]:
        """The messages ``node`` can be: each a list of its literal pieces."""
        if depth > DEPTH:
            return []
        deeper = depth + 1
        module = self.module_of[id(scope)]
        match node:
            case ast.Constant(value=str(text)):
                return [_between(PERCENT_FIELD.split(text))]
            case ast.JoinedStr():
                own = [
                    v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else FIELD
                    for v in node.values
                ]
                if _key(own):
                    return [own]
                # "round {t}: {table}": the message is what fills it.
                values = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
                return [t for v in values for t in self.texts(v, scope, deeper)]
            case ast.BinOp(op=ast.Mod()):
                return self.texts(node.left, scope, depth)
            case ast.BinOp():
                left = self.texts(node.left, scope, depth)
                right = self.texts(node.right, scope, depth)
                if len(left) != 1 or len(right) != 1:  # lists added: their messages, each
                    return left + right
                return [left[0] + right[0]]  # one text added to another
            case ast.List() | ast.Tuple():
                return [t for e in node.elts for t in self.texts(e, scope, depth)]
            case ast.IfExp():
                return self.texts(node.body, scope, depth) + self.texts(node.orelse, scope, depth)
            case ast.BoolOp():
                return [t for v in node.values for t in self.texts(v, scope, depth)]
            case ast.Subscript() | ast.Starred():
                return self.texts(node.value, scope, depth)
            case ast.Name():
                assigned = self._assigned(node.id, scope)
                return [t for v, s in assigned for t in self.texts(v, s, deeper)]
            case ast.Attribute():  # the values given to that name, or a property's returns
                given = self._lookup(self.attributes, module, node.attr, local=False)
                texts = [t for v, s in given for t in self.texts(v, s, deeper)]
                return texts + self._returned(module, node.attr, deeper, local=False)
            case ast.Call():
                return self._called(node, scope, deeper)
        return []

    def _called(self, call: ast.Call, scope: Scope, depth: int) -> list[list[str]]:
        func = call.func
        module = self.module_of[id(scope)]
        if isinstance(func, ast.Attribute) and func.attr == "format":
            return self.texts(func.value, scope, depth)
        if returned := self._returned(module, _name(func), depth, local=False):
            return returned
        # A wrapper that is not phalanx's (``str(exc)``, ``Problem(text, ...)``): its first argument.
        return self.texts(call.args[0], scope, depth) if call.args else []

    def _returned(self, module: str, name: str, depth: int, local: bool) -> list[list[str]]:
        return [
            t
            for fn in self._lookup(self.functions, module, name, local)
            for ret in ast.walk(fn)
            if isinstance(ret, ast.Return) and ret.value is not None
            for t in self.texts(ret.value, fn, depth)
        ]

    def _assigned(self, name: str, scope: Scope) -> Iterator[tuple[ast.expr, Scope]]:
        if not isinstance(scope, ast.Module):
            yield from self._passed(name, scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and name in _target_names(node.targets):
                yield node.value, scope
            elif isinstance(node, (ast.NamedExpr, ast.AnnAssign, ast.AugAssign)) and (
                _name(node.target) == name
            ):
                if node.value is not None:
                    yield node.value, scope
            elif isinstance(node, (ast.For, ast.comprehension)) and _name(node.target) == name:
                yield node.iter, scope
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("append", "extend")
                and _name(node.func.value) == name
                and node.args
            ):
                yield node.args[0], scope

    def _passed(
        self, name: str, fn: ast.FunctionDef | ast.AsyncFunctionDef
    ) -> Iterator[tuple[ast.expr, Scope]]:
        """What phalanx's calls of ``fn`` give its parameter ``name`` (a method's calls are
        looked for in its own module)."""
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if name not in params + [a.arg for a in fn.args.kwonlyargs]:
            return
        method = bool(params) and params[0] in ("self", "cls")
        module = self.module_of[id(fn)]
        for call, scope in self._lookup(self.calls, module, fn.name, local=False):
            held = (self.module_of[id(scope)], _name(getattr(call.func, "value", call.func)))
            if method and held in self.containers:
                continue
            at = params.index(name) - method if name in params else -1
            if 0 <= at < len(call.args):
                yield call.args[at], scope
            yield from ((k.value, scope) for k in call.keywords if k.arg == name)


CONTAINERS = ("set", "list", "dict", "frozenset", "defaultdict", "deque", "Counter", "OrderedDict")
CONTAINER_NODES = (ast.Set, ast.List, ast.Dict, ast.SetComp, ast.ListComp, ast.DictComp)


def _builds_container(node: ast.Assign | ast.AnnAssign) -> bool:
    """Whether the assignment binds a builtin container (a display, a comprehension, a call
    of its type, or an annotation naming one)."""
    value = node.value
    if isinstance(value, CONTAINER_NODES):
        return True
    if isinstance(value, ast.Call) and _name(value.func) in CONTAINERS:
        return True
    annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
    kind = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return kind is not None and _name(kind) in CONTAINERS


def _target_names(targets: list[ast.expr]) -> set[str]:
    """The names an assignment binds (``a = ...``, ``a, b = ...``)."""
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def worded_classes(trees: list[ast.Module], errors: set[str]) -> dict[str, tuple[ast.expr, Scope]]:
    """The error classes that word their own message: class -> (the text its ``__init__``
    gives ``super().__init__``, that ``__init__``)."""
    worded: dict[str, tuple[ast.expr, Scope]] = {}
    for tree in trees:
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef) or cls.name not in errors:
                continue
            for init in cls.body:
                if not isinstance(init, ast.FunctionDef) or init.name != "__init__":
                    continue
                for call in ast.walk(init):
                    if (
                        isinstance(call, ast.Call)
                        and _name(call.func) == "__init__"
                        and call.args
                        and isinstance(call.args[0], ast.JoinedStr)
                    ):
                        worded[cls.name] = (call.args[0], init)
    return worded


def _raised(
    node: ast.Raise, scope: Scope, source: Source, input_module: bool
) -> Iterator[tuple[ast.expr, Scope]]:
    """What a ``raise`` prints: its error's first argument, or the errors a function of
    phalanx returns (``raise _unsafe(...)``); nothing for a class that words its own."""
    if not isinstance(node.exc, ast.Call):
        return
    name = _name(node.exc.func)
    if name in source.worded:
        return
    if name in source.errors or (input_module and name in INPUT_ERRORS):
        yield from ((arg, scope) for arg in node.exc.args[:1])
        return
    module = source.module_of[id(source.tree_of(node))]
    for fn in source._lookup(source.functions, module, name, local=False):
        for ret in ast.walk(fn):
            if (
                isinstance(ret, ast.Return)
                and isinstance(ret.value, ast.Call)
                and _name(ret.value.func) in source.errors
                and ret.value.args
            ):
                yield ret.value.args[0], fn


def _made(node: ast.AST, source: Source) -> bool:
    """An error of phalanx's made and not raised where it is made (``_raised`` reads those).
    Read in ``agent/`` only: an agent run ends by returning a ``RunEnd`` that carries its
    error to where the end is reported and the error raised (``agent.runend``)."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    name = _name(node.func)
    return name in source.errors and name not in source.worded and id(node) not in source.raised


def _collects_problems(call: ast.Call, scope: Scope) -> bool:
    """``problems.append(...)``, ``notes.append(...)``, or ``p.add(...)`` where ``p`` is a
    parameter annotated as a ``Problems`` (the usage error's list)."""
    if not isinstance(call.func, ast.Attribute) or not call.args:
        return False
    owner, verb = _name(call.func.value), call.func.attr
    if owner in ("problems", "notes") and verb == "append":
        return True
    if verb != "add" or isinstance(scope, ast.Module):
        return False
    params = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
    return any(
        a.arg == owner
        and a.annotation is not None
        and ast.unparse(a.annotation).endswith("Problems")
        for a in params
    )


def _message_args(
    tree: ast.Module, input_module: bool, source: Source, agent_module: bool = False
) -> Iterator[tuple[ast.expr, Scope]]:
    for node, scope in _scopes(tree):
        if isinstance(node, ast.Raise):
            yield from _raised(node, scope, source, input_module)
        elif agent_module and _made(node, source):  # carried by a ``RunEnd``, raised later
            assert isinstance(node, ast.Call)
            yield from ((arg, scope) for arg in node.args[:1])
        elif isinstance(node, ast.Call) and _collects_problems(node, scope):
            yield node.args[0], scope
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, verb = _name(node.func.value), node.func.attr
            if owner == "log" and verb in LOG_LEVELS and node.args:
                # A log line is its format and what fills it: ``log.warning("%s", line)``.
                yield ast.Tuple(elts=node.args, lineno=node.lineno), scope
    for text, init in source.worded.values():
        if source.tree_of(init) is tree:
            yield text, init


def _between(pieces: list[str]) -> list[str]:
    """The pieces of a text split at its fields, with a FIELD between each two."""
    return [x for p in pieces for x in (FIELD, p)][1:]


def template(pieces: list[str]) -> str:
    """The message as the page shows it: ``…`` where a value is filled in."""
    return " ".join("".join("…" if p == FIELD else p for p in pieces).split())


def _key(pieces: list[str]) -> str | None:
    collapsed = [" ".join(p.split()) for p in pieces if p != FIELD]
    # A piece with no space is a name met on the way (a thread's, a variable's), not words.
    long = [p for p in collapsed if len(p) >= MIN_KEY and " " in p]
    if long:
        key = max(long, key=len)
        # "--signals-to-handle: … cannot be caught by any process": the words it starts with
        # tell it from "--preempt-signals: … cannot be caught ...", so they are part of its key.
        first = collapsed[0].strip() if pieces[0] != FIELD else ""
        if len(first) >= MIN_PREFIX and first not in key:
            return f"{first}{FIELD}{key}"
        return key
    # Short pieces between values ("… launcher: … is not set"): the whole message, with its ….
    shown = template(pieces)
    words = shown.replace("…", "").strip(" :")
    return shown.strip("… ") if len(words) >= MIN_KEY and " " in words else None


@dataclass
class Found:
    keys: dict[str, str] = field(default_factory=dict)  # key -> where (path:line)
    shown: dict[str, str] = field(default_factory=dict)  # key -> the message as the page shows it
    unkeyed: dict[str, str] = field(default_factory=dict)  # "module: argument" -> where
    seen: set[str] = field(default_factory=set)  # every message's "module: argument"


def scan() -> Found:
    """Every message in src/phalanx: its key, or why it has none."""
    source = Source()
    found = Found()
    for relative, tree in source.trees.items():
        input_module, agent_module = (
            relative.startswith(INPUT_MODULES),
            relative.startswith("agent/"),
        )
        for arg, scope in _message_args(tree, input_module, source, agent_module):
            where = f"src/phalanx/{relative}:{arg.lineno}"
            if isinstance(arg, ast.Tuple):  # a log line: its format, or what fills a bare "%s"
                fmt, *values = arg.elts
                texts = source.texts(fmt, scope)
                if not any(_key(text) for text in texts):
                    texts = [t for value in values for t in source.texts(value, scope)]
            else:
                texts = source.texts(arg, scope)
            keyed = [(k, text) for text in texts if (k := _key(text)) and k not in NOT_MESSAGES]
            for key, text in keyed:
                found.keys.setdefault(key, where)
                found.shown.setdefault(key, template(text))
            unkeyed = f"{relative}: {ast.unparse(arg)}"
            if not keyed:
                found.unkeyed[unkeyed] = where
            found.seen.add(unkeyed)
    return found


def messages() -> dict[str, str]:
    """key -> where (path:line), for every message with a key."""
    return scan().keys


def on_page(key: str, text: str) -> bool:
    """Whether ``text`` (the page, whitespace collapsed) holds the message of ``key``: its
    words, and the words it starts with before them in the same entry when it has those."""
    if FIELD not in key:
        return key in text
    first, rest = key.split(FIELD)
    return re.search(re.escape(first) + r"[^`]*" + re.escape(rest), text) is not None


def missing(page: str, found: Found | None = None) -> dict[str, str]:
    """The messages the page does not hold (whitespace collapsed on both sides)."""
    text = " ".join(page.split())
    keys = (found or scan()).keys
    return {key: where for key, where in keys.items() if not on_page(key, text)}


if __name__ == "__main__":
    found = scan()
    lacking = missing(PAGE.read_text(), found)
    for key, where in sorted(lacking.items(), key=lambda kv: kv[1]):
        print(f"{where}: {found.shown[key]}")
    for unkeyed, where in found.unkeyed.items():
        if unkeyed not in UNKEYED:
            print(f"{where}: no key and not in UNKEYED: {unkeyed}")
    for stale in set(UNKEYED) - found.seen:
        print(f"UNKEYED names a message no longer in the source: {stale}")
