"""phalanx.checkpoint under faults, in real processes (tests/support/checkpoint_writers.py):
a writer SIGKILLed at each of its filesystem calls in turn, re-saves of a step included; two
writers in one directory; a reader racing the writer's pruning and re-saves."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx import checkpoint
from support.checkpoint_writers import SCENARIOS, identify, state
from support.launch import wait_for

SRC = Path(__file__).resolve().parents[2] / "src"
WRITERS = Path(__file__).parents[1] / "support" / "checkpoint_writers.py"
HANG = 60.0  # bounds that only catch a hang


class Writers:
    """The template process of tests/support/checkpoint_writers.py, and its requests."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(WRITERS.parents[1])])}
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITERS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # the template and every child it forks: one group
        )
        assert self._answer() == {"ready": True}

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], HANG)
        assert ready, "the writers' template did not answer"
        line = self.proc.stdout.readline()
        assert line, f"the writers' template exited ({self.proc.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        return self._answer()

    def start(self, role: str, **request: Any) -> int:
        pid: int = self.ask({"run": role, **request})["pid"]
        return pid

    def wait(self, pid: int) -> dict[str, Any]:
        return self.ask({"wait": pid})

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the template's own group
        self.proc.wait(timeout=HANG)


@pytest.fixture(scope="module")
def writers() -> Iterator[Writers]:
    template = Writers()
    try:
        yield template
    finally:
        template.close()


def _events(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- a SIGKILL at every filesystem call of a save --------------------------------------------

# What may be loadable after the counted save of each scenario was killed: the newest complete
# checkpoint before it, or the one it was writing; never None once a checkpoint existed.
ALLOWED: dict[str, set[tuple[int, str] | None]] = {
    "first": {None, (1, "new")},
    "next": {(1, "old"), (2, "new")},
    "resave": {(1, "old"), (1, "new")},
    "resave_newest": {(2, "old"), (2, "new")},  # never back to step 1
}


def _durability_problems(calls: list[list[str]]) -> list[str]:
    """What the calls leave to chance on a power cut: a file renamed before its data was
    fsynced, a rename or a new directory whose parent directory is not fsynced after it and
    before the next rename (or the end of the save)."""
    problems: list[str] = []
    synced: set[str] = set()  # files fsynced so far
    owed: list[str] = []  # directories that must be fsynced before the next rename
    for name, path, *failed in calls:
        if failed:
            continue
        if name == "fsync":
            synced.add(path)
            owed = [d for d in owed if d != path]
        elif name == "mkdir":
            owed.append(str(Path(path).parent))
        elif name == "replace":
            src, dst = path.split(" -> ")
            if src not in synced:
                problems.append(f"{src} renamed to {dst} before its data was fsynced")
            problems += [f"{d} not fsynced before renaming {src}" for d in owed]
            owed = [str(Path(dst).parent)]
    return problems + [f"{d} not fsynced at the end of the save" for d in owed]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_sigkill_at_every_filesystem_call_of_a_save(
    writers: Writers, tmp_path: Path, scenario: str
) -> None:
    """The save is run once to count its calls (N), then once per k = 1..N, SIGKILLed just
    before its k-th call; after each kill, load_latest gives a whole checkpoint, the previous
    one or the new one, and the next save into the directory succeeds and clears the debris."""
    trace = tmp_path / "trace.json"
    whole = writers.start("scenario", scenario=scenario, dir=str(tmp_path / "whole"), kill_at=0, trace=str(trace))  # fmt: skip
    assert writers.wait(whole) == {"exit": 0}
    calls: list[list[str]] = json.loads(trace.read_text())
    names = {call[0] for call in calls}
    assert {"open", "file.write", "fsync", "replace", "flock"} <= names, names
    assert _durability_problems(calls) == []

    for k in range(1, len(calls) + 2):
        root = tmp_path / f"k{k}"
        pid = writers.start("scenario", scenario=scenario, dir=str(root), kill_at=k, trace=str(root / "trace"))  # fmt: skip
        status = writers.wait(pid)
        folder = root / "ck" / "run"
        if k > len(calls):  # past the last call: the save completes
            assert status == {"exit": 0}
            assert identify(checkpoint.load_latest(folder)) == SCENARIOS[scenario][1][:2]
            break
        assert status == {"signal": signal.SIGKILL}, f"kill at call {k} {calls[k - 1]}"
        got = identify(checkpoint.load_latest(folder))
        assert got in ALLOWED[scenario], f"killed at call {k} {calls[k - 1]}: loaded {got}"
        assert checkpoint.latest(folder) == (None if got is None else checkpoint.checkpoints(folder)[-1])  # fmt: skip

        checkpoint.save(state(9, "new"), folder, 9, keep=1)
        left = sorted(p.name for p in folder.iterdir() if p.name != checkpoint.LOCK_FILE)
        assert left == ["step_000000009.pt", "step_000000009.pt.done"], f"killed at call {k}"


# --- two writers in one directory --------------------------------------------------------------


def test_a_second_writer_waits_for_the_first_then_both_checkpoints_are_whole(
    writers: Writers, tmp_path: Path
) -> None:
    """Writer A is held in the middle of its save (pickling); writer B's save into the same
    directory waits for it, says so, and goes on once A is done: both saves complete, in that
    order, and both checkpoints are whole (without the lock, B's pruning removed A's temporary
    file and A's save failed)."""
    folder, events = tmp_path / "ck", tmp_path / "events"
    flag, release = tmp_path / "flag", tmp_path / "release"
    a = writers.start("writer", who="A", dir=str(folder), steps=[1], keep=None, events=str(events),
                      stall_on=1, flag=str(flag), release=str(release))  # fmt: skip
    try:
        wait_for(flag.exists, HANG, "writer A to be in the middle of its save", every=0.005)
        b = writers.start("writer", who="B", dir=str(folder), steps=[2], keep=None, events=str(events))  # fmt: skip
        wait_for(
            lambda: any(e.startswith("B ") for e in _events(events)),
            HANG,
            "writer B to wait or save",
            every=0.005,
        )
        said = f"B log checkpoint directory {folder} is locked by pid {a} on "
        assert _events(events)[0].startswith(said), _events(events)
    finally:
        release.write_text("go")
    assert writers.wait(a) == {"exit": 0}, _events(events)
    assert writers.wait(b) == {"exit": 0}, _events(events)
    assert [e for e in _events(events) if " saved " in e] == ["A saved 1", "B saved 2"]
    assert [c.step for c in checkpoint.checkpoints(folder)] == [1, 2]
    assert identify(checkpoint.load_latest(folder)) == (2, "new")


def test_a_writer_held_past_the_lock_timeout_is_named_in_one_error(
    writers: Writers, tmp_path: Path
) -> None:
    folder, events = tmp_path / "ck", tmp_path / "events"
    flag, release = tmp_path / "flag", tmp_path / "release"
    a = writers.start("writer", who="A", dir=str(folder), steps=[1], keep=None, events=str(events),
                      stall_on=1, flag=str(flag), release=str(release))  # fmt: skip
    try:
        wait_for(flag.exists, HANG, "writer A to be in the middle of its save", every=0.005)
        b = writers.start("writer", who="B", dir=str(folder), steps=[2], keep=None,
                          events=str(events), lock_timeout=0.2)  # fmt: skip
        assert writers.wait(b) == {"exit": 1}
    finally:
        release.write_text("go")
    assert writers.wait(a) == {"exit": 0}
    errors = [e for e in _events(events) if e.startswith("B error")]
    assert len(errors) == 1, _events(events)
    assert errors[0].startswith(
        f"B error 2 CheckpointLocked: checkpoint directory {folder} is still locked by pid {a} "
        f"on {socket.gethostname()} (saving step 1 since "
    ), errors
    assert "after waiting 0.2 s (lock_timeout=0.2)" in errors[0]
    assert [c.step for c in checkpoint.checkpoints(folder)] == [1]


def test_two_writers_saving_at_once(writers: Writers, tmp_path: Path) -> None:
    """Two processes save interleaved steps into one directory as fast as they can: no save
    fails, each returns a checkpoint that is complete on disk, every logged checkpoint exists,
    and a final prune leaves the newest two, whole."""
    folder, events, log = tmp_path / "ck", tmp_path / "events", tmp_path / "ckpt.log"
    common = {"dir": str(folder), "keep": None, "events": str(events), "log": str(log)}
    pids = [
        writers.start("writer", who=who, steps=list(range(first, 80, 2)), **common)
        for who, first in (("A", 0), ("B", 1))
    ]
    for pid in pids:
        assert writers.wait(pid) == {"exit": 0}, [e for e in _events(events) if "error" in e]
    assert sorted(c.step for c in checkpoint.checkpoints(folder)) == list(range(80))
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(e["step"] for e in logged) == list(range(80))
    checkpoint.prune(folder, keep=2)
    assert [c.step for c in checkpoint.checkpoints(folder)] == [78, 79]
    assert identify(checkpoint.load_latest(folder)) == (79, "new")


# --- a reader racing the writer's pruning -----------------------------------------------------


@pytest.mark.parametrize("resave", [False, True], ids=["new-steps", "resaves"])
def test_a_reader_racing_the_writer_always_loads_a_whole_checkpoint(
    writers: Writers, tmp_path: Path, resave: bool
) -> None:
    """A writer saves 500 times with keep=1 -- new steps, each save removing the one before,
    or step 1 again and again, alternating two sizes -- while a reader process calls
    load_latest in a loop: every load returns a whole checkpoint, never None."""
    folder, events, done = tmp_path / "ck", tmp_path / "events", tmp_path / "done"
    checkpoint.save(state(1, "new"), folder, 1, keep=1)
    steps = [1] * 500 if resave else list(range(2, 502))
    writer = writers.start("writer", who="W", dir=str(folder), steps=steps, keep=1,
                           alternate=resave, events=str(events))  # fmt: skip
    reader = writers.start("reader", dir=str(folder), until=str(done), events=str(events))
    try:
        assert writers.wait(writer) == {"exit": 0}
    finally:
        done.write_text("done")
    assert writers.wait(reader) == {"exit": 0}, [e for e in _events(events) if "error" in e]
    loads = [e for e in _events(events) if e.startswith("reader loads ")]
    assert len(loads) == 1 and int(loads[0].split()[-1]) > 1
