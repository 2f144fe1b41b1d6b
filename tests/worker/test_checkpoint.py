"""phalanx.inscript.checkpoint: atomic save, latest/load_latest, pruning, the checkpoint log, a
full disk (a tiny tmpfs), and real child processes SIGKILLed in the middle of a checkpoint
write. tests/worker/test_checkpoint_faults.py kills a writer at every call of a save, runs two
writers into one directory and races a reader against pruning."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from phalanx import checkpoint
from phalanx.inscript.checkpoint import Checkpoint
from phalanx.worker.contract import CHECKPOINT_LOG_ENV
from support.launch import wait_for
from support.tools import STRACE, needs_strace, tiny_tmpfs

SRC = Path(__file__).resolve().parents[2] / "src"


def _state(step: int) -> dict[str, object]:
    return {"step": step, "w": torch.full((4, 4), float(step)), "opt": {"lr": 0.1}}


def _names(folder: Path) -> list[str]:
    """The directory's entries, without the writers' lock file."""
    return sorted(p.name for p in folder.iterdir() if p.name != checkpoint.LOCK_FILE)


def test_save_then_latest_and_load(tmp_path: Path) -> None:
    done = checkpoint.save(_state(7), tmp_path / "ck", 7)
    assert done == Checkpoint(tmp_path / "ck" / "step_000000007.pt", 7)
    assert checkpoint.latest(tmp_path / "ck") == done
    loaded = checkpoint.load_latest(tmp_path / "ck")
    assert loaded["step"] == 7 and torch.equal(loaded["w"], torch.full((4, 4), 7.0))
    marker = json.loads((tmp_path / "ck" / "step_000000007.pt.done").read_text())
    assert marker["step"] == 7 and marker["path"] == "step_000000007.pt"
    assert marker["size"] == done.path.stat().st_size
    assert _names(tmp_path / "ck") == ["step_000000007.pt", "step_000000007.pt.done"]


def test_nothing_to_resume(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "missing") is None
    assert checkpoint.load_latest(tmp_path / "missing") is None
    assert checkpoint.latest(tmp_path) is None


def test_keeps_the_newest_two_by_default(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        checkpoint.save(_state(step), tmp_path, step)
    assert [c.step for c in checkpoint.checkpoints(tmp_path)] == [15, 20]
    assert _names(tmp_path) == [
        "step_000000015.pt",
        "step_000000015.pt.done",
        "step_000000020.pt",
        "step_000000020.pt.done",
    ]


def test_keep_none_keeps_all_and_prune_trims(tmp_path: Path) -> None:
    for step in range(1, 5):
        checkpoint.save(_state(step), tmp_path, step, keep=None)
    assert [c.step for c in checkpoint.checkpoints(tmp_path)] == [1, 2, 3, 4]
    removed = checkpoint.prune(tmp_path, keep=1)
    assert sorted(p.name for p in removed) == ["step_000000001.pt", "step_000000002.pt", "step_000000003.pt"]  # fmt: skip
    assert [c.step for c in checkpoint.checkpoints(tmp_path)] == [4]
    with pytest.raises(ValueError, match="keep must be >= 1 or None, got 0"):
        checkpoint.save(_state(5), tmp_path, 5, keep=0)


def test_steps_sort_numerically_past_the_padding(tmp_path: Path) -> None:
    checkpoint.save(_state(999_999_999), tmp_path, 999_999_999, keep=None)
    checkpoint.save(_state(1_000_000_000), tmp_path, 1_000_000_000, keep=None)
    assert checkpoint.latest(tmp_path) == Checkpoint(tmp_path / "step_1000000000.pt", 1_000_000_000)  # fmt: skip


def test_debris_of_killed_writes_is_ignored_then_pruned(tmp_path: Path) -> None:
    checkpoint.save(_state(10), tmp_path, 10)
    # What a kill can leave: a temporary file, a renamed file whose marker never came, and
    # (after a kill inside prune) a marker without its file. Also a marker that lies.
    (tmp_path / ".step_000000020.pt.123.abcd.tmp").write_bytes(b"half a pickle")
    torch.save(_state(30), tmp_path / "step_000000030.pt")
    (tmp_path / "step_000000005.pt.done").write_text('{"step": 5, "path": "step_000000005.pt", "size": 1}')  # fmt: skip
    torch.save(_state(40), tmp_path / "step_000000040.pt")
    (tmp_path / "step_000000040.pt.done").write_text('{"step": 40, "path": "step_000000040.pt", "size": 3}')  # fmt: skip
    assert checkpoint.latest(tmp_path) == Checkpoint(tmp_path / "step_000000010.pt", 10)
    assert checkpoint.load_latest(tmp_path)["step"] == 10

    checkpoint.save(_state(11), tmp_path, 11)
    assert _names(tmp_path) == [
        "step_000000010.pt",
        "step_000000010.pt.done",
        "step_000000011.pt",
        "step_000000011.pt.done",
    ]


def test_checkpoint_files_honour_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        done = checkpoint.save(_state(1), tmp_path, 1)
    finally:
        os.umask(old)
    assert done.path.stat().st_mode & 0o777 == 0o644


def test_save_file_replaces_atomically(tmp_path: Path) -> None:
    target = checkpoint.save_file({"a": torch.ones(2)}, tmp_path / "sub" / "final.pt")
    checkpoint.save_file({"a": torch.zeros(2)}, target)
    assert torch.equal(torch.load(target)["a"], torch.zeros(2))
    assert _names(target.parent) == ["final.pt"]


def test_checkpoint_log_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "ckpt.log"
    monkeypatch.setenv(CHECKPOINT_LOG_ENV, str(log))
    before = time.time()
    a = checkpoint.save(_state(1), tmp_path / "ck", 1)
    b = checkpoint.save(_state(2), tmp_path / "ck", 2)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["step"], e["path"]) for e in lines] == [(1, str(a.path)), (2, str(b.path))]
    assert all(before <= e["time"] <= time.time() for e in lines)
    assert set(lines[0]) == {"step", "path", "time"}


def test_no_log_without_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECKPOINT_LOG_ENV, raising=False)
    checkpoint.save(_state(1), tmp_path / "ck", 1)
    assert _names(tmp_path) == ["ck"]


def test_a_save_never_prunes_the_checkpoint_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older step saved after a newer one (a late writer) is kept, not removed by its own
    pruning: what save returns and logs exists; the next save prunes it."""
    log = tmp_path / "ckpt.log"
    monkeypatch.setenv(CHECKPOINT_LOG_ENV, str(log))
    checkpoint.save(_state(5), tmp_path / "ck", 5, keep=1)
    late = checkpoint.save(_state(3), tmp_path / "ck", 3, keep=1)
    assert late in checkpoint.checkpoints(tmp_path / "ck")
    assert checkpoint.latest(tmp_path / "ck") == Checkpoint(tmp_path / "ck" / "step_000000005.pt", 5)  # fmt: skip
    assert all(Path(json.loads(line)["path"]).exists() for line in log.read_text().splitlines())
    checkpoint.save(_state(6), tmp_path / "ck", 6, keep=1)
    assert [c.step for c in checkpoint.checkpoints(tmp_path / "ck")] == [6]


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    checkpoint.save(_state(1), tmp_path, 1, keep=1)
    checkpoint.save({"step": 1, "w": torch.ones(1000)}, tmp_path, 1, keep=1)
    assert torch.equal(checkpoint.load_latest(tmp_path)["w"], torch.ones(1000))
    assert _names(tmp_path) == ["step_000000001.pt", "step_000000001.pt.done"]
    marker = json.loads((tmp_path / "step_000000001.pt.done").read_text())
    assert set(marker) == {"step", "path", "size", "time"}  # no second size once it is done


def test_only_debris_is_nothing_to_resume(tmp_path: Path) -> None:
    torch.save(_state(30), tmp_path / "step_000000030.pt")
    (tmp_path / ".step_000000040.pt.1.abcd.tmp").write_bytes(b"half")
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.load_latest(tmp_path) is None


@needs_strace
def test_a_filesystem_without_flock_saves_unlocked_with_a_warning(tmp_path: Path) -> None:
    """flock(2) made to fail with ENOSYS, as on Lustre mounted without flock (strace injects
    the error at the system call): each save says so in one line and goes on as the only
    writer, and the checkpoints are complete."""
    folder = tmp_path / "ck"
    script = "import sys\nfrom phalanx import checkpoint\nfor step in (1, 2, 3):\n    checkpoint.save({'step': step}, sys.argv[1], step)\n"  # fmt: skip
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    assert STRACE is not None
    result = subprocess.run(
        [STRACE, "-f", "-qq", "-o", os.devnull, "-e", "trace=flock", "-e",
         "inject=flock:error=ENOSYS", sys.executable, "-c", script, str(folder)],
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = f"checkpoint directory {folder} cannot be locked (Function not implemented): saving as its only writer"  # fmt: skip
    assert result.stderr.splitlines() == [said] * 3
    assert [c.step for c in checkpoint.checkpoints(folder)] == [2, 3]


# --- a full disk ------------------------------------------------------------------------------


def test_a_full_disk_mid_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """4 MiB into a 256 KiB tmpfs: save fails with OSError ENOSPC naming the checkpoint
    (torch.save's own RuntimeError, which wraps it, is its cause), removes its temporary
    file, and the previous checkpoint still loads."""
    with tiny_tmpfs(tmp_path / "disk", "256k") as disk:
        checkpoint.save(_state(1), disk / "ck", 1, keep=1)
        with pytest.raises(OSError) as raised:
            checkpoint.save({"step": 2, "w": torch.zeros(1 << 20)}, disk / "ck", 2, keep=1)
        assert raised.value.errno == errno.ENOSPC, raised.value
        assert raised.value.filename == str(disk / "ck" / "step_000000002.pt"), raised.value
        assert "No space left on device" in str(raised.value)
        assert _names(disk / "ck") == ["step_000000001.pt", "step_000000001.pt.done"]
        assert checkpoint.load_latest(disk / "ck")["step"] == 1


@pytest.mark.parametrize("step", [1, 2], ids=["resave", "next"])
def test_a_full_disk_at_the_marker_keeps_the_previous_checkpoint(tmp_path: Path, step: int) -> None:
    """The disk is filled so that the new checkpoint's data fits and its marker does not: save
    raises ENOSPC from writing the marker, and the previous checkpoint (step 1, with keep=1)
    still loads, whether the save was of step 1 again or of step 2."""
    new = {"step": step, "w": torch.full((8192,), 2.0)}
    encoded = io.BytesIO()
    torch.save(new, encoded)
    with tiny_tmpfs(tmp_path / "disk", "256k") as disk:
        checkpoint.save(_state(1), disk / "ck", 1, keep=1)
        page = os.statvfs(disk).f_bsize
        free = os.statvfs(disk).f_bavail * page
        (disk / "filler").write_bytes(bytes(free - -(-len(encoded.getvalue()) // page) * page))
        with pytest.raises(OSError) as raised:
            checkpoint.save(new, disk / "ck", step, keep=1)
        assert raised.value.errno == errno.ENOSPC
        assert "_write_marker" in [entry.name for entry in raised.traceback]
        loaded = checkpoint.load_latest(disk / "ck")
        assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.full((4, 4), 1.0))


# --- real processes killed mid-write ---------------------------------------------------------

# The child saves step 1, then starts step 2 with an object whose pickling announces itself
# and stalls: the kill then lands inside save(), after the temporary file exists and before
# anything is renamed, every time.
STALLED_WRITER = """
import sys, time
from collections.abc import Callable
from pathlib import Path
import torch
from phalanx import checkpoint

folder, flag = Path(sys.argv[1]), Path(sys.argv[2])

class Stall:
    def __reduce__(self):
        flag.write_text("pickling")
        time.sleep(120)
        return (Stall, ())

checkpoint.save({"step": 1, "w": torch.full((4, 4), 1.0)}, folder, 1)
checkpoint.save({"step": 2, "w": torch.zeros(1 << 20), "stall": Stall()}, folder, 2)
"""

# The child saves 16 MiB checkpoints in a loop; the test kills it while a temporary file is
# growing, wherever in the write that happens to be.
LOOPING_WRITER = """
import sys
import torch
from phalanx import checkpoint

step = 0
while True:
    step += 1
    checkpoint.save({"step": step, "w": torch.full((1 << 22,), float(step))}, sys.argv[1], step)
"""


def _start(script: str, *args: Path) -> subprocess.Popen[bytes]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        env=env,
        start_new_session=True,
    )


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    """``condition``, failing at once if the writer exited before it (fine-grained: a write
    in progress lasts milliseconds)."""

    def met() -> bool:
        assert proc.poll() is None, f"writer exited ({proc.returncode}) before {what}"
        return condition()

    wait_for(met, 120, what, every=0.002)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _tmp_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.endswith(".tmp")] if folder.is_dir() else []


def test_sigkill_mid_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    folder, flag = tmp_path / "ck", tmp_path / "flag"
    proc = _start(STALLED_WRITER, folder, flag)
    try:
        _wait_for(flag.exists, proc, "the second save to start pickling")
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        _kill(proc)
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)

    # The kill landed mid-write: step 2's temporary file exists, nothing was renamed.
    assert [p.name.startswith(".step_000000002.pt.") for p in _tmp_files(folder)] == [True]
    assert not (folder / "step_000000002.pt").exists()
    assert checkpoint.latest(folder) == Checkpoint(folder / "step_000000001.pt", 1)
    loaded = checkpoint.load_latest(folder)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.full((4, 4), 1.0))

    checkpoint.save({"step": 2}, folder, 2)  # the rerun's save clears the debris
    assert _tmp_files(folder) == []
    assert [c.step for c in checkpoint.checkpoints(folder)] == [1, 2]


def _bytes_landing(folder: Path) -> bool:
    """A complete checkpoint exists and a later one's temporary file has bytes in it."""
    if checkpoint.latest(folder) is None:
        return False
    for tmp in _tmp_files(folder):
        try:
            if tmp.stat().st_size > 0:
                return True
        except FileNotFoundError:
            pass  # renamed between listing and stat
    return False


def test_sigkill_at_an_arbitrary_point_of_a_large_write(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    proc = _start(LOOPING_WRITER, folder)
    try:
        _wait_for(lambda: _bytes_landing(folder), proc, "a checkpoint write in progress")
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        _kill(proc)

    newest = checkpoint.latest(folder)
    assert newest is not None
    for ck in checkpoint.checkpoints(folder):  # every checkpoint that counts is whole
        loaded = torch.load(ck.path)
        assert loaded["step"] == ck.step
        assert torch.equal(loaded["w"], torch.full((1 << 22,), float(ck.step)))
