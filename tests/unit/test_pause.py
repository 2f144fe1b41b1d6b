"""``phalanx.pause()``: the pause depth in the progress counters' memory (a context manager
and a decorator, nesting, a beat on the way out), and nothing at all outside phalanx."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import phalanx
from phalanx.worker import progress


@pytest.fixture
def counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process's counters mapped, as a worker's are (put back as they were after)."""
    for name in ("_beats", "_step", "_paused", "_map"):
        monkeypatch.setattr(progress, name, getattr(progress, name))
    fd = progress.make_counters(str(tmp_path))
    progress.open_counters(str(tmp_path))
    progress.hold(str(tmp_path), fd)  # read from the descriptor, as the agent does
    yield str(tmp_path / progress.FILE_NAME)
    progress.hold(str(tmp_path), None)
    os.close(fd)


def test_a_pause_is_counted_while_it_lasts_and_ends_with_a_beat(counters: str) -> None:
    assert progress.read_counters(counters) == (0, progress.NO_STEP, 0)
    with phalanx.pause():
        with phalanx.pause():
            assert progress.read_counters(counters) == (0, progress.NO_STEP, 2)
        assert progress.read_counters(counters) == (1, progress.NO_STEP, 1)
    assert progress.read_counters(counters) == (2, progress.NO_STEP, 0)
    assert progress.read(counters) == (2, progress.NO_STEP)


def test_pause_decorates_a_function(counters: str) -> None:
    @phalanx.pause()
    def evaluate() -> int:
        found = progress.read_counters(counters)
        return found[2] if found else -1

    assert evaluate() == 1 and evaluate() == 1
    assert progress.read_counters(counters) == (2, progress.NO_STEP, 0)


def test_outside_phalanx_a_pause_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_paused", None)
    monkeypatch.setattr(progress, "_beats", None)
    with phalanx.pause():
        pass

    @phalanx.pause()
    def three() -> int:
        return 3

    assert three() == 3
