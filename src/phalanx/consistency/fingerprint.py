"""What a node publishes at the rendezvous so the nodes can see they run the same code.

A fingerprint is a flat ``{field: value}`` of short strings (a few hundred bytes: hashes,
never contents):

- ``python``: implementation and version (``cpython 3.12.3``); ``phalanx``: its version.
- ``torch``: the installed distribution's version, read with ``importlib.metadata`` -- the
  agent never imports torch. ``cuda``: the ``cuda = '...'`` line of the distribution's
  ``torch/version.py``, read as text (a CPU build says ``None``: no field). ``nccl``: the
  version of an installed ``nvidia-nccl-cu*`` distribution (what PyPI's CUDA wheels load);
  a build that links NCCL in (conda, source) has no such distribution: no field.
  A field that could not be read is left out, and a field is compared only between the
  nodes that have it ("compare what exists").
- ``script``: the content hash of the training script (the module's file for ``-m``, found
  as the worker's ``python -m`` would, without importing anything; the program for
  ``--no-python``), ``missing`` when there is none.
- ``args``: the program's arguments, as given, a JSON list (``ARGS_SHOWN`` characters at
  most; a longer list is its hash, ``N args <hash>``); ``per-node`` for ``phalanx.spawn``,
  whose nodes are told their node rank on their command lines. Never a reason to stop:
  nodes whose arguments differ run, as under torchrun (an output name per node), and
  ``consistency.perargs`` names what differs. They travel only to the job's nodes, over
  the token-authenticated store, and were on each node's command line (``ps``) already.
- ``file ARG``: for each argument (or the value of ``--flag=VALUE``) that names a regular
  file, its content hash, keyed by the argument as written -- relative paths compare the
  same file in different checkouts. Directories are not hashed; a file over
  ``MAX_HASHED`` bytes is recorded by its size only (hashing it would delay every start).
  A node compares it only where its own arguments name it (``names_path``): a per-node
  output file left by the last run on one node is no difference.

Hashes are sha256, cut to 16 hex digits: this catches accidents (a stale copy), it is not a
defence against someone forging a collision.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import json
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.config import LaunchMode, WorkersConfig
from phalanx.version import __version__

MAX_HASHED = 64 * 1024 * 1024  # bytes; larger files are compared by size
HASH_DIGITS = 16
MISSING = "missing"
PER_NODE = "per-node"
ARGS = "args"
ARGS_SHOWN = 1024  # characters of the JSON list; a longer one is published as its hash
VERSION_FIELDS = ("python", "phalanx", "torch", "cuda", "nccl")
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


@dataclass(frozen=True)
class Target:
    """What the workers run: ``kind`` is ``script``, ``module`` or ``program``."""

    kind: str
    name: str
    args: tuple[str, ...] = ()
    # The arguments differ between nodes by design (phalanx.spawn: the node rank): not even
    # said, as they would be when they differ (consistency.perargs).
    per_node_args: bool = False


def target_of(workers: WorkersConfig) -> Target:
    """The user's program of a CLI launch (``--run-path`` runs a script too)."""
    kinds = {LaunchMode.MODULE: "module", LaunchMode.NO_PYTHON: "program"}
    return Target(
        kinds.get(workers.mode, "script"),
        workers.program,
        workers.program_args,
    )


def node_fingerprint(target: Target, cwd: Path | None = None) -> dict[str, str]:
    """This node's fingerprint (see the module docstring); relative paths are from ``cwd``
    (default: the working directory, the workers' too)."""
    base = cwd or Path.cwd()
    found = versions()
    found["script"] = file_hash(_program_file(target, base))
    found[ARGS] = PER_NODE if target.per_node_args else args_field(target.args)
    for path in named_paths(target.args):
        if _is_file(base / path):
            found[f"file {path}"] = file_hash(base / path)
    return found


def args_field(args: Sequence[str]) -> str:
    """The ``args`` field: the arguments as a JSON list, or their hash when that is long."""
    shown = json.dumps(list(args), ensure_ascii=False)
    return shown if len(shown) <= ARGS_SHOWN else args_hash(args)


def node_args(fingerprint: Mapping[str, str]) -> list[str] | None:
    """A node's arguments from its fingerprint (None: published as a hash, ``per-node``, by
    an older phalanx, or not at all)."""
    try:
        args = json.loads(fingerprint.get(ARGS, ""))
    except ValueError:
        return None
    if isinstance(args, list) and all(isinstance(arg, str) for arg in args):
        return args
    return None


def named_paths(args: Sequence[str]) -> list[str]:
    """What each argument would name as a path: itself, or the value of ``--flag=VALUE``."""
    paths = (arg.partition("=")[2] if arg.startswith("-") else arg for arg in args)
    return [path for path in paths if path]


def names_path(fingerprint: Mapping[str, str], path: str) -> bool:
    """Whether the node's arguments name ``path`` (True when they cannot be read)."""
    args = node_args(fingerprint)
    return args is None or path in named_paths(args)


def versions() -> dict[str, str]:
    """The version fields that can be read here, without importing torch."""
    impl = sys.implementation
    v = sys.version_info
    found = {"python": f"{impl.name} {v.major}.{v.minor}.{v.micro}", "phalanx": __version__}
    try:
        torch = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    if torch is not None:
        found["torch"] = torch.version
        cuda = _cuda_of(Path(str(torch.locate_file("torch/version.py"))))
        if cuda:
            found["cuda"] = cuda
    nccl = _nccl_version()
    if nccl:
        found["nccl"] = nccl
    return found


def args_hash(args: Sequence[str]) -> str:
    """sha256 of the arguments (NUL-separated, so ``a b`` and ``"a b"`` differ), cut short,
    with their count in front: ``2 args 1f0c...``."""
    digest = hashlib.sha256(b"\0".join(arg.encode("utf-8", "surrogateescape") for arg in args))
    return f"{len(args)} args {digest.hexdigest()[:HASH_DIGITS]}"


def file_hash(path: Path | None) -> str:
    """sha256 of the file's content (cut short), its size beyond ``MAX_HASHED``, or
    ``missing`` for no regular file."""
    if path is None or not _is_file(path):
        return MISSING
    try:
        size = path.stat().st_size
        if size > MAX_HASHED:
            return f"{size} bytes (not hashed)"
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return MISSING
    return digest.hexdigest()[:HASH_DIGITS]


def _is_file(path: Path) -> bool:
    """A regular file; False for anything that cannot even be looked up (an argument that
    is no path at all: too long a name, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _program_file(target: Target, base: Path) -> Path | None:
    if target.kind == "module":
        return _module_file(target.name, [str(base), *sys.path])
    path = base / target.name
    if target.kind == "program" and not _is_file(path):
        which = shutil.which(target.name)
        return Path(which) if which else None
    return path


def _module_file(name: str, search: Sequence[str]) -> Path | None:
    """The file ``python -m name`` runs (a package's ``__main__``), found level by level with
    the path finder, which imports nothing (``importlib.util.find_spec`` would import the
    parent packages, running the user's code in the agent)."""
    locations: list[str] | None = list(search)
    spec = None
    parts = name.split(".")
    for depth in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        return _module_file(f"{name}.__main__", search) if locations else None
    return Path(spec.origin) if spec.origin else None


def _cuda_of(version_file: Path) -> str | None:
    try:
        text = version_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _CUDA_LINE.search(text)
    return match.group(1) if match else None


def _nccl_version() -> str | None:
    versions = sorted(
        f"{dist.metadata['Name']} {dist.version}"
        for dist in importlib.metadata.distributions()
        if str(dist.metadata["Name"] or "").lower().replace("_", "-").startswith("nvidia-nccl")
    )
    return ", ".join(versions) or None
