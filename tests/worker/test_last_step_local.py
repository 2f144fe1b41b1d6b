"""``checkpoint.LastStep`` outside phalanx (no rank directory): no watch thread, no notice;
the copy is written only when an exception ends the ``with`` block, never on a normal exit,
and never over a complete checkpoint of its step or a later one. Real files, real torch."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from phalanx import checkpoint


@pytest.fixture(autouse=True)
def _outside_phalanx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)


def _watchers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "phalanx-laststep"]


def test_an_exception_exit_writes_the_copy_taken_at_update(tmp_path: Path) -> None:
    weights = torch.zeros(3)
    with pytest.raises(RuntimeError), checkpoint.LastStep(tmp_path) as last:
        last.update(3, {"step": 3, "w": weights, "nested": [weights, (1.5, "x")]})
        weights += 1  # the step after: the copy must not see it
        raise RuntimeError("a collective failed")
    assert _watchers() == []
    done = checkpoint.latest(tmp_path)
    assert done is not None and done.step == 3
    state = checkpoint.load_latest(tmp_path)
    assert torch.equal(state["w"], torch.zeros(3))
    assert torch.equal(state["nested"][0], torch.zeros(3)) and state["nested"][1] == (1.5, "x")


def test_a_normal_exit_writes_nothing(tmp_path: Path) -> None:
    with checkpoint.LastStep(tmp_path) as last:
        last.update(3, {"w": torch.ones(2)})
    assert checkpoint.latest(tmp_path) is None


def test_a_complete_later_step_is_not_written_over(tmp_path: Path) -> None:
    checkpoint.save({"w": torch.ones(2)}, tmp_path, 5)
    with pytest.raises(RuntimeError), checkpoint.LastStep(tmp_path) as last:
        last.update(4, {"w": torch.zeros(2)})
        raise RuntimeError("failed")
    assert [c.step for c in checkpoint.checkpoints(tmp_path)] == [5]
    assert last.save() is None  # the same step again: nothing either
    assert checkpoint.save_if_newer({"w": torch.zeros(2)}, tmp_path, 6) is not None
