"""Files the agent's watch writes: whole or not at all (a reader polling for them never sees
half of one), and never over an earlier one."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary(path)
    temporary.write_text(text)
    os.replace(temporary, path)


def write_stacks_file(run_dir: Path, text: str) -> Path:
    """``text`` into a new ``<run dir>/stacks_<time>.txt`` (``_2``, ``_3``, ... within a
    second); returns its path. ``phalanx stacks`` waits for a new one and prints it.

    Safe from several threads at once (a node's own request is written by a helper thread):
    the name is taken with a hard link, which fails rather than replace a file."""
    path = run_dir / f"stacks_{time.strftime('%Y%m%d-%H%M%S')}.txt"
    temporary = _temporary(path)
    temporary.write_text(text)
    try:
        candidate, n = path, 1
        while True:
            try:
                os.link(temporary, candidate)
                return candidate
            except FileExistsError:
                n += 1
                candidate = path.with_name(f"{path.stem}_{n}{path.suffix}")
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
