"""Files the agent's watch writes: whole or not at all (a reader polling for them never sees
half of one), never over an earlier one, and never through a symlink
(``phalanx.worker.nofollow``)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from phalanx.worker.nofollow import make_dirs, open_dir, open_file, replace_file


def write_atomic(path: Path, text: str) -> None:
    make_dirs(path.parent)
    replace_file(path, text.encode())


def write_stacks_file(run_dir: Path, text: str) -> Path:
    """``text`` into a new ``<run dir>/stacks_<time>.txt`` (``_2``, ``_3``, ... within a
    second); returns its path. ``phalanx stacks`` waits for a new one and prints it.

    Safe from several threads at once (a node's own request is written by a helper thread):
    the name is taken with a hard link, which fails rather than replace a file."""
    path = run_dir / f"stacks_{time.strftime('%Y%m%d-%H%M%S')}.txt"
    temporary = f".{path.name}.{os.getpid()}.{threading.get_ident()}"
    fd = open_file(run_dir / temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    dir_fd = open_dir(run_dir)
    try:
        candidate, n = path.name, 1
        while True:
            try:
                os.link(temporary, candidate, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                return run_dir / candidate
            except FileExistsError:
                n += 1
                candidate = f"{path.stem}_{n}{path.suffix}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        os.close(dir_fd)
