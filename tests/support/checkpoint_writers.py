"""Checkpoint writers and readers in real processes, forked from one template.

``tests/worker/test_checkpoint_faults.py`` runs this file as a script. It imports torch and phalanx
once, then answers requests on stdin, one JSON object a line:

    {"run": ROLE, ...}   fork a child that runs ROLES[ROLE](request); answer {"pid": PID}
    {"wait": PID}        wait for that child; answer {"exit": CODE} or {"signal": NUMBER}

Forking keeps each of the many short writers a real process that a real SIGKILL ends,
without paying for an import of torch in each of them.

The "scenario" role counts its filesystem calls and SIGKILLs itself just before the k-th one
("kill_at"; 0 never kills): every call of the ``os`` and ``fcntl`` functions in COUNTED, and
every write or flush of a file made with ``os.fdopen`` (``torch.save`` writes through one).
A child that finishes writes the calls it made, in order, to "trace" as a JSON list of
``[name, path]``, or ``[name, path, "failed"]`` for one that raised OSError.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from phalanx import checkpoint
from phalanx.worker.contract import CHECKPOINT_LOG_ENV

OLD, NEW = 16, 1024  # tensor lengths of the two versions of a state (different file sizes)
COUNTED = ("open", "write", "pwrite", "ftruncate", "fsync", "replace", "rename", "unlink",
           "mkdir", "rmdir")  # fmt: skip
ORIGINAL = {name: getattr(os, name) for name in COUNTED}
ORIGINAL_FLOCK = fcntl.flock
ORIGINAL_FDOPEN = os.fdopen


def state(step: int, tag: str) -> dict[str, object]:
    """A state whose content says what it is: its step, and which version ("old"/"new")."""
    return {"step": step, "tag": tag, "w": torch.full((OLD if tag == "old" else NEW,), float(step))}


def identify(loaded: Any) -> tuple[int, str] | None:
    """(step, tag) of a loaded state, after checking it is whole; None for None."""
    if loaded is None:
        return None
    step, tag, w = loaded["step"], loaded["tag"], loaded["w"]
    expected = torch.full((OLD if tag == "old" else NEW,), float(step))
    if not torch.equal(w, expected):
        raise AssertionError(f"torn checkpoint: step {step} {tag} holds {w}")
    return step, tag


# --- counting filesystem calls ------------------------------------------------------------


class Counter:
    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.calls: list[list[str]] = []

    def tick(self, name: str, path: str) -> None:
        self.calls.append([name, path])
        if len(self.calls) == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def _fd_path(fd: object) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except (OSError, TypeError):
        return "?"


def _arg_path(name: str, args: tuple[Any, ...]) -> str:
    if name in ("write", "pwrite", "ftruncate", "fsync"):
        return _fd_path(args[0].fileno() if hasattr(args[0], "fileno") else args[0])
    if name in ("replace", "rename"):
        return f"{os.fspath(args[0])} -> {os.fspath(args[1])}"
    return os.fspath(args[0])


class CountedFile:
    """A file from os.fdopen whose writes and flushes are counted."""

    def __init__(self, counter: Counter, f: Any) -> None:
        self._counter, self._f = counter, f

    def write(self, data: bytes) -> int:
        self._counter.tick("file.write", _fd_path(self._f.fileno()))
        return int(self._f.write(data))

    def flush(self) -> None:
        self._counter.tick("file.flush", _fd_path(self._f.fileno()))
        self._f.flush()

    def __enter__(self) -> CountedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def arm(counter: Counter) -> None:
    def counted(name: str) -> Callable[..., Any]:
        real = ORIGINAL[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            counter.tick(name, _arg_path(name, args))
            try:
                return real(*args, **kwargs)
            except OSError:
                counter.calls[-1].append("failed")  # e.g. mkdir of a directory that exists
                raise

        return call

    for name in COUNTED:
        setattr(os, name, counted(name))

    def flock(fd: int, operation: int) -> None:
        counter.tick("flock", _fd_path(fd))
        ORIGINAL_FLOCK(fd, operation)

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> CountedFile:
        return CountedFile(counter, ORIGINAL_FDOPEN(fd, *args, **kwargs))

    fcntl.flock = flock  # type: ignore[assignment]
    os.fdopen = fdopen  # type: ignore[assignment]


def disarm() -> None:
    for name, real in ORIGINAL.items():
        setattr(os, name, real)
    fcntl.flock = ORIGINAL_FLOCK
    os.fdopen = ORIGINAL_FDOPEN


# --- roles -------------------------------------------------------------------------------

# Each scenario: what is saved before the counting starts, then the one save that is counted.
# The checkpoint directory is <dir>/ck/run; "first" creates it (and <dir>/ck).
SCENARIOS: dict[str, tuple[list[tuple[int, str, int]], tuple[int, str, int]]] = {
    "first": ([], (1, "new", 1)),
    "next": ([(1, "old", 1)], (2, "new", 1)),
    "resave": ([(1, "old", 1)], (1, "new", 1)),
    "resave_newest": ([(1, "old", 2), (2, "old", 2)], (2, "new", 2)),
}


def run_scenario(request: dict[str, Any]) -> None:
    folder = Path(request["dir"]) / "ck" / "run"
    before, (step, tag, keep) = SCENARIOS[request["scenario"]]
    for old_step, old_tag, old_keep in before:
        checkpoint.save(state(old_step, old_tag), folder, old_step, keep=old_keep)
    counter = Counter(request["kill_at"])
    arm(counter)
    checkpoint.save(state(step, tag), folder, step, keep=keep)
    disarm()
    Path(request["trace"]).write_text(json.dumps(counter.calls))


def _event(path: str, line: str) -> None:
    # One write(2) on an O_APPEND descriptor: the processes' lines never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Stall:
    """Pickled inside a state: says so in ``flag``, then waits for ``release`` to exist."""

    def __init__(self, flag: str, release: str) -> None:
        self.flag, self.release = flag, release

    def __reduce__(self) -> tuple[type, tuple[()]]:
        Path(self.flag).write_text("pickling")
        deadline = time.monotonic() + 60
        while not Path(self.release).exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        from collections import OrderedDict

        return (OrderedDict, ())


class EventHandler(logging.Handler):
    def __init__(self, events: str, who: str) -> None:
        super().__init__()
        self.events, self.who = events, who

    def emit(self, record: logging.LogRecord) -> None:
        _event(self.events, f"{self.who} log {record.getMessage()}")


def run_writer(request: dict[str, Any]) -> None:
    """Saves request["steps"] in order into request["dir"]; records each in "events"."""
    who, events, folder = request["who"], request["events"], request["dir"]
    logging.getLogger("phalanx").addHandler(EventHandler(events, who))
    keep, options = request.get("keep"), {}
    if "log" in request:
        os.environ[CHECKPOINT_LOG_ENV] = request["log"]
    if "lock_timeout" in request:
        options["lock_timeout"] = request["lock_timeout"]
    for i, step in enumerate(request["steps"]):
        # "alternate": every other save is the small version, so re-saves change the size.
        obj: dict[str, object] = state(step, "old" if request.get("alternate") and i % 2 else "new")
        if step == request.get("stall_on"):
            obj["stall"] = Stall(request["flag"], request["release"])
        try:
            done = checkpoint.save(obj, folder, step, keep=keep, **options)
        except Exception as e:
            _event(events, f"{who} error {step} {type(e).__name__}: {e}")
            sys.exit(1)
        # With keep=None nobody removes a complete checkpoint: the one save returned must be
        # complete on disk now, whatever the other writer did meanwhile.
        if keep is None and done not in checkpoint.checkpoints(folder):
            _event(events, f"{who} error {step} save returned {done.path.name}, not complete")
            sys.exit(1)
        _event(events, f"{who} saved {step}")


def run_reader(request: dict[str, Any]) -> None:
    """load_latest in a loop until "until" exists; every load must be a whole checkpoint."""
    loads, until = 0, Path(request["until"])
    while True:
        finished = until.exists()
        try:
            got = identify(checkpoint.load_latest(request["dir"]))
        except Exception as e:
            _event(request["events"], f"reader error after {loads} loads: {type(e).__name__}: {e}")
            sys.exit(1)
        if got is None:
            _event(request["events"], f"reader error after {loads} loads: None")
            sys.exit(1)
        loads += 1
        if finished:
            break
    _event(request["events"], f"reader loads {loads}")


ROLES: dict[str, Callable[[dict[str, Any]], None]] = {
    "scenario": run_scenario,
    "writer": run_writer,
    "reader": run_reader,
}


def _child(request: dict[str, Any]) -> None:
    code = 1
    try:
        ROLES[request["run"]](request)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "run" in request:
            pid = os.fork()
            if pid == 0:
                _child(request)
            answer: dict[str, int] = {"pid": pid}
        else:
            _, status = os.waitpid(request["wait"], 0)
            if os.WIFSIGNALED(status):
                answer = {"signal": os.WTERMSIG(status)}
            else:
                answer = {"exit": os.WEXITSTATUS(status)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
