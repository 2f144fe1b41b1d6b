"""``python hangfs.py BACKING MOUNTPOINT``: a passthrough FUSE filesystem that can stop
answering, the way a hung NFS mount does.

Every operation is passed through to ``BACKING``. While the file ``BACKING/.frozen`` exists
(the test creates and removes it), every ``write`` and ``create`` waits -- the calling
process sleeps in the kernel, as it would on a dead file server -- until the file is gone,
and so does the ``flush`` (at ``close``) of a file written to since its last flush: as with
NFS, closing a file with data to send hangs, closing one with none does not. Reads, lookups and listings go on answering, so the test can still look around.
Used by ``hang_filesystem`` in ``tests/multinode/test_chaos.py``; it runs as its own process and ends
when the mountpoint is unmounted.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any

import mfusepy as fuse


class Passthrough(fuse.Operations):  # type: ignore[misc]
    use_ns = True  # nanosecond times, as os.lstat gives them
    def __init__(self, backing: str) -> None:
        self.backing = backing
        self.switch = os.path.join(backing, ".frozen")
        self.dirty: set[int] = set()  # handles written to since their last flush

    def _path(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _wait_while_frozen(self) -> None:
        while os.path.exists(self.switch):
            time.sleep(0.05)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._path(path))
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime",
                "st_ctime")  # fmt: skip
        return {key: getattr(st, key) for key in keys}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *(n for n in os.listdir(self._path(path)) if n != ".frozen")]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._path(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._path(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._path(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._path(old), self._path(new))

    # Symbolic links, as the filesystems it stands in for (NFS, a local disk) have them: the
    # progress counters are a link to the agent's memfd (``phalanx.worker.progress``).
    def symlink(self, target: str, source: str) -> None:
        os.symlink(source, self._path(target))

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._path(path), mode)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        os.truncate(self._path(path), length)

    def utimens(self, path: str, times: Any = None) -> None:
        os.utime(self._path(path))

    def open(self, path: str, flags: int) -> int:
        return os.open(self._path(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._wait_while_frozen()
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._wait_while_frozen()
        self.dirty.add(fh)
        return os.write(fh, data)  # the fd was opened with the caller's flags (O_APPEND)

    def flush(self, path: str, fh: int) -> None:
        if fh in self.dirty:
            self._wait_while_frozen()
            self.dirty.discard(fh)

    def release(self, path: str, fh: int) -> None:
        self.dirty.discard(fh)
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self._wait_while_frozen()
        os.fsync(fh)

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.backing)
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")  # fmt: skip
        return {key: getattr(st, key) for key in keys}

    def access(self, path: str, amode: int) -> None:
        if not os.access(self._path(path), amode):
            raise fuse.FuseOSError(errno.EACCES)


if __name__ == "__main__":
    backing, mountpoint = sys.argv[1], sys.argv[2]
    fuse.FUSE(Passthrough(backing), mountpoint, foreground=True, nothreads=False,
              allow_other=False)  # fmt: skip
