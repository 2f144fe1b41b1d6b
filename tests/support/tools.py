"""The outside programs the tests use, each found one way, here and nowhere else.

``shutil.which``, as phalanx itself finds ``py-spy``: a program counts as installed when it
is on PATH. A test that needs one carries its mark (``needs_etcd``, ``needs_py_spy``); under
``CI=true`` a skip fails the run (see ``conftest``), so a missing program is an install
problem to fix, not a test quietly left out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.launch import wait_for

ETCD = shutil.which("etcd")  # Debian's etcd-server puts it in /usr/bin
PY_SPY = shutil.which("py-spy")  # the test extras install it
STRACE = shutil.which("strace")  # makes one syscall fail for real (scripts/setup-test-env.sh)
# torchrun as its module under this interpreter, not the ``torchrun`` on PATH: torch is a
# dependency, so it is always there, and a version-manager shim (pyenv) in front of a PATH
# entry would add variables of its own to the workers' environment.
HANGFS = Path(__file__).parent / "hangfs.py"  # a FUSE filesystem that can stop answering
SLOWFS = Path(__file__).parent / "slowfs.py"  # one whose every operation takes a second
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")

needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd is not on PATH (Debian: etcd-server)")
needs_strace = pytest.mark.skipif(STRACE is None, reason="strace is not on PATH (Debian: strace)")
needs_py_spy = pytest.mark.skipif(
    PY_SPY is None,
    reason="py-spy is not on PATH (the test extras install it: pip install -e '.[test]')",
)

# torch's own exit-time abort: a Gloo thread still joinable while the interpreter finalizes
# (seen about once in twenty suite runs, in torchrun's workers and in cold phalanx workers
# alike; warm phalanx workers skip finalization). Tests that meet it record it as an
# expected failure, with the output, rather than retry.
TORCH_EXIT_ABORT = "terminate called without an active exception"


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only), unmounted after: a disk that fills."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, timeout=30)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


_READ_ONLY_TRIES = 20  # (a job's writes are short: the window is milliseconds wide)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` made read-only in place (root only): a read-only bind mount of it over
    itself, unmounted after. Files already open for writing keep their mount (as after a
    filesystem turned read-only under a writer that holds them); every new open by path
    gets EROFS. (A ``remount,ro`` of the whole filesystem is refused while a file on it is
    open for writing, and a running job always holds some.) The bind mount and its turn to
    read-only are two calls: a file the job opens for writing in between, through the new
    mount, makes the second refuse ("mount point is busy"); then the bind mount is dropped
    and made again, up to ``_READ_ONLY_TRIES`` times."""
    for tries_left in reversed(range(_READ_ONLY_TRIES)):
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True, timeout=30)
        remount = ["mount", "-o", "remount,bind,ro", str(path)]
        done = subprocess.run(remount, capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            break
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)
        if not tries_left:
            raise subprocess.CalledProcessError(done.returncode, remount, done.stdout, done.stderr)
        time.sleep(0.05)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


def fill(directory: Path) -> None:
    """Write a file in ``directory`` until its filesystem says ENOSPC (a disk that is full)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, bytes(4096))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return
    finally:
        os.close(fd)


@contextlib.contextmanager
def hang_filesystem(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A FUSE mount (``support/hangfs.py``) that stops answering writes while
    ``<backing>/.frozen`` exists, as a hung NFS mount does: yields (mountpoint, switch).
    Thawed, unmounted and its daemon ended after, whatever happened."""
    switch = tmp_path / "backing" / ".frozen"
    with _fuse_mount(tmp_path, [str(HANGFS)], thaw=lambda: switch.unlink(missing_ok=True)) as mnt:
        yield mnt, switch


@contextlib.contextmanager
def slow_filesystem(
    tmp_path: Path, low: float = 0.5, high: float = 1.0
) -> Iterator[tuple[Path, Path]]:
    """A FUSE mount (``support/slowfs.py``) whose every operation takes ``low`` to ``high``
    seconds while ``<backing>/.slow`` exists, as a struggling NFS server answers: yields
    (mountpoint, switch). Unmounted and its daemon ended after, whatever happened."""
    switch = tmp_path / "backing" / ".slow"
    with _fuse_mount(tmp_path, [str(SLOWFS), str(low), str(high)]) as mountpoint:
        yield mountpoint, switch


@contextlib.contextmanager
def _fuse_mount(
    tmp_path: Path, program: list[str], thaw: Callable[[], None] = lambda: None
) -> Iterator[Path]:
    """``python PROGRAM[0] BACKING MOUNTPOINT PROGRAM[1:]``, mounted at ``tmp_path/mnt``;
    ``thaw`` runs before the unmount (so a daemon that holds a caller can let go)."""
    backing, mountpoint = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mountpoint.mkdir()
    daemon = subprocess.Popen(
        [sys.executable, program[0], str(backing), str(mountpoint), *program[1:]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: os.path.ismount(mountpoint), 60.0, "the FUSE mount")
        yield mountpoint
    finally:
        thaw()
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], timeout=30, check=False)
        # Detached, the mount can hold nothing up: a daemon still in a slow operation (or
        # waiting on the kernel to drop the connection) is killed after 2 s, not 10 (it took
        # the whole 10 s about one teardown in three, 10 s of every test that mounts one).
        try:
            daemon.wait(2)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(10)
