"""The files phalanx writes for itself are best effort (docs/explanation/faults.md):
a full, read-only or deleted run directory costs a line each, never the job, a checkpoint,
a restart, or a stop. Each fault is made for real under a running job: a tiny tmpfs that
fills, a read-only bind mount over the run directory, the directory removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx import checkpoint
from phalanx.events.log import read_events
from phalanx.worker import progress
from support.launch import launched, run_phalanx, wait_for, worker
from support.tools import fill, read_only, tiny_tmpfs

HANG = 120.0  # bounds that only catch a hang


@contextlib.contextmanager
def _broken(run_dir: Path, fault: str) -> Iterator[None]:
    """``run_dir`` full, read-only or deleted for the ``with`` block."""
    if fault == "read-only":
        with read_only(run_dir):
            yield
        return
    if fault == "full":
        fill(run_dir)
    else:
        _remove(run_dir)
    yield


def _remove(run_dir: Path) -> None:
    """``rm -r run_dir`` under its running agent, which may put a temporary file there
    (status.json's) while it is being removed: again until it is gone."""

    def gone() -> bool:
        shutil.rmtree(run_dir, ignore_errors=True)
        return not run_dir.exists()

    wait_for(gone, HANG, f"{run_dir} removed")


def test_a_full_log_disk_lets_restarted_workers_run(tmp_path: Path) -> None:
    """The first attempt fills a 64 KiB --log-dir and fails; the restarted worker runs to
    its end: exit 0, one restart spent. Its progress counters are the agent's memory, only
    linked from the full disk, so it has them and says nothing about them (it used to say
    once that it could not write them)."""
    with tiny_tmpfs(tmp_path / "logs") as logs:
        args = ["--max-restarts", "2", "--log-dir", str(logs),
                worker("chatty.py"), "200", "fail-once"]  # fmt: skip
        result = run_phalanx(args, timeout=HANG)
    assert result.returncode == 0, result.stderr[-4000:]
    last_lines = [n for n in result.stdout.splitlines() if n.startswith("[rank0]: line 000199 ")]
    assert len(last_lines) == 2  # each attempt wrote everything, to the console
    assert "/progress (" not in result.stderr, result.stderr[-4000:]
    assert "restarting the worker group (restart 1 of 2)" in result.stderr
    assert "restart 2 of 2" not in result.stderr


@pytest.mark.parametrize("fault", ["full", "read-only", "deleted"])
def test_a_checkpoint_is_saved_whatever_became_of_the_run_directory(
    tmp_path: Path, fault: str
) -> None:
    """``phalanx.checkpoint.save`` into a healthy directory while the run directory (where
    its log line goes) is full, read-only or gone: the checkpoint is whole and loadable,
    the worker says once that the line could not be written, and the job exits 0."""
    shared = tmp_path / "shared"
    shared.mkdir()
    with tiny_tmpfs(tmp_path / "logs", size="1m") as logs:
        args = ["--log-dir", str(logs), worker("save_when_told.py"), str(shared)]
        with launched(args) as job:
            wait_for(lambda: (shared / "ready").exists(), HANG, "the worker")
            (run_dir,) = logs.iterdir()
            with _broken(run_dir, fault):
                (shared / "go").touch()
                out, err = job.communicate(timeout=HANG)
    assert job.returncode == 0, err
    assert "[rank0]: saved step 1" in out.splitlines()
    assert checkpoint.load_latest(shared / "ckpt") == {"step": 1}
    said = [n for n in err.splitlines() if "checkpoints.jsonl" in n]
    assert len(said) == 1, err
    assert said[0].startswith(f"[rank0]: phalanx: cannot write {run_dir}/checkpoints.jsonl (")
    assert "is saved whole, but the launcher cannot count it" in said[0]
    assert "Traceback" not in err


def test_progress_that_cannot_be_recorded_is_not_taken_for_none(tmp_path: Path) -> None:
    """A worker steps (``phalanx.step``) and fails the same way every attempt. After the
    first attempt the run directory turns read-only, so the second attempt's counters
    cannot be made: its progress is unknown, and the same failure again is no crash loop.
    The job spends its whole budget (3 attempts) and exits with the worker's 3."""
    shared = tmp_path / "shared"
    shared.mkdir()
    with tiny_tmpfs(tmp_path / "logs", size="1m") as logs:
        args = ["--max-restarts", "2", "--log-dir", str(logs),
                worker("progress_or_fail.py"), str(shared), "step", "gate"]  # fmt: skip
        with launched(args) as job:
            wait_for(lambda: (shared / "shown.0").exists(), HANG, "the first attempt's steps")
            (run_dir,) = logs.iterdir()
            with read_only(run_dir):
                (shared / "go").touch()  # the first attempt fails now
                _, err = job.communicate(timeout=HANG)
    assert job.returncode == 3, err
    assert "crash loop" not in err
    assert "job failed after 3 attempt(s)" in err
    unknown = [n for n in err.splitlines() if "progress of this node's ranks is unknown" in n]
    assert len(unknown) == 1 and "(Read-only file system)" in unknown[0], err
    assert "restarting the worker group (restart 2 of 2)" in err


def test_stop_on_a_read_only_run_directory_warns_and_stops_the_job(tmp_path: Path) -> None:
    """``phalanx stop`` cannot leave its ``requests/stop`` marker: one warning, and the
    SIGTERM still goes: the job ends with 143."""
    shared = tmp_path / "shared"
    shared.mkdir()
    logs = tmp_path / "logs"
    args = ["--log-dir", str(logs), worker("hold_until_go.py"), str(shared)]
    with tiny_tmpfs(logs, size="1m"), launched(args) as job:
        wait_for(lambda: (shared / "ready0").exists(), HANG, "the worker")
        (run_dir,) = logs.iterdir()
        with read_only(run_dir):
            stop = run_phalanx(["stop", str(run_dir)], timeout=HANG)
            _, err = job.communicate(timeout=HANG)
    assert stop.returncode == 0, stop.stderr
    assert job.returncode == 143, err
    warned = [n for n in stop.stderr.splitlines() if "warning" in n]
    assert len(warned) == 1, stop.stderr
    assert f"cannot write {run_dir}/requests/stop (Read-only file system)" in warned[0]
    assert "stopping anyway" in warned[0]
    # The agent writes report.json through the run directory it opened at its start
    # (``agent.filewriter``), which the read-only bind mount made later does not cover: the
    # report may be there. ``phalanx stop`` says which.
    (said,) = [n for n in stop.stderr.splitlines() if "the job stopped" in n]
    assert said in (
        "phalanx: the job stopped (no report.json was written)",
        f"phalanx: the job stopped; report: {run_dir}/report.json",
    ), stop.stderr


def test_stop_on_a_deleted_run_directory_names_the_agents_pid(tmp_path: Path) -> None:
    """The run directory removed under a running job: ``phalanx stop`` cannot read
    ``launcher.json``, so it names the agent (the process holding the run's event log
    open) and how to stop it, in one line, exit 1; doing what it says stops the job."""
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    with launched(["--log-dir", str(logs), worker("hold_until_go.py"), str(shared)]) as job:
        wait_for(lambda: (shared / "ready0").exists(), HANG, "the worker")
        (run_dir,) = logs.iterdir()
        wait_for(lambda: (run_dir / "events.jsonl").exists(), HANG, "the event log")
        _remove(run_dir)
        stop = run_phalanx(["stop", str(run_dir)], timeout=HANG)
        lines = stop.stderr.strip().splitlines()
        assert stop.returncode == 1 and len(lines) == 1, stop.stderr
        assert f"{run_dir} was deleted" in lines[0]
        assert f"its agent is pid {job.pid} " in lines[0]
        assert lines[0].endswith(f"stop it with kill -TERM {job.pid}")
        os.kill(job.pid, signal.SIGTERM)  # as it says
        _, err = job.communicate(timeout=HANG)
    assert job.returncode == 143, err


def test_a_hang_on_a_read_only_run_directory_is_still_reported(tmp_path: Path) -> None:
    """A rank stops making progress after the run directory turned read-only: the hang
    report's files cannot be written (one line), and the job still ends with the hang as
    its root cause, exit 1, the report on the console."""
    shared = tmp_path / "shared"
    shared.mkdir()
    logs = tmp_path / "logs"
    # The rank steps until "go" (touched once the directory is read-only), then stalls: the
    # hang's clock starts after the fault, so a short --stall-timeout cannot beat the mount.
    args = ["--stall-timeout", "3", "--log-dir", str(logs),
            worker("step_then_wait.py"), str(shared), "go"]  # fmt: skip
    with tiny_tmpfs(logs, size="1m"), launched(args) as job:
        wait_for(lambda: (shared / "ready").exists(), HANG, "the worker's first step")
        (run_dir,) = logs.iterdir()
        with read_only(run_dir):
            (shared / "go").touch()  # no progress from now on
            _, err = job.communicate(timeout=HANG)
    assert job.returncode == 1, err
    said = [n for n in err.splitlines() if "hang_report" in n]
    assert len(said) == 1 and "(Read-only file system)" in said[0], err
    assert "Root cause: rank 0 (local rank 0)" in err and "[hang]" in err
    assert "report: not written" in err
    assert "Traceback" not in err


def test_a_stop_notice_that_cannot_be_written_is_said(tmp_path: Path) -> None:
    """Under ``--preempt-signals SIGTERM`` phalanx leaves a stop notice before its own
    SIGTERM to a worker; on a read-only run directory it cannot: one line says so, and the
    job still ends with the failing rank's exit code."""
    shared = tmp_path / "shared"
    shared.mkdir()
    logs = tmp_path / "logs"
    args = ["--preempt-signals", "SIGTERM", "--nproc-per-node", "2", "--log-dir", str(logs),
            worker("freeze_me.py"), str(shared)]  # fmt: skip
    with tiny_tmpfs(logs, size="1m"), launched(args) as job:
        wait_for(lambda: (shared / "victim.pid").exists(), HANG, "both workers")
        (run_dir,) = logs.iterdir()
        with read_only(run_dir):
            (shared / "go").touch()  # rank 0 exits 3; phalanx stops rank 1
            _, err = job.communicate(timeout=HANG)
    assert job.returncode == 3, err
    said = [n for n in err.splitlines() if "/stopping (" in n]
    assert len(said) == 1, err
    assert f"cannot write {run_dir}/attempt_0/rank_1/stopping (Read-only file system)" in said[0]


def test_the_event_log_goes_on_once_a_full_disk_has_room_again(tmp_path: Path) -> None:
    """The log disk full while a worker fails (its events are lost, said once), then freed:
    the events after that are written again (it used to stop for good at the first failed
    write), the line torn by the full disk costs only itself, and the log says how many
    were lost."""
    shared = tmp_path / "shared"
    shared.mkdir()
    pid_file = shared / "worker0.pid"

    def next_worker(old: int) -> int:
        wait_for(lambda: pid_file.exists() and int(pid_file.read_text()) != old, HANG, "a worker")
        return int(pid_file.read_text())

    with tiny_tmpfs(tmp_path / "logs", size="1m") as logs:
        # "beat": progress every attempt (the counters are memory, made on the full disk
        # too), so the same SIGKILL again is no crash loop that would end the job early
        args = ["--max-restarts", "4", "--log-dir", str(logs), worker("stubborn_sleep.py"),
                str(shared), "beat"]  # fmt: skip
        with launched(args) as job:
            pid = next_worker(0)
            (run_dir,) = logs.iterdir()
            events = run_dir / "events.jsonl"
            wait_for(lambda: b"workers_started" in events.read_bytes(), HANG, "the first events")
            fill(logs)
            for _ in range(3):  # attempts 2-4's events meet the full disk (a few KiB: more
                os.kill(pid, signal.SIGKILL)  # than the event log's last page had left)
                pid = next_worker(pid)
            (logs / "filler").unlink()
            os.kill(pid, signal.SIGKILL)  # attempt 5's are written again
            pid = next_worker(pid)
            os.kill(pid, signal.SIGKILL)  # the budget is spent: the job ends
            _, err = job.communicate(timeout=HANG)
        written = read_events(events)
    assert job.returncode == 137, err[-3000:]  # the failed worker's SIGKILL
    assert "events: cannot write" in err and "event(s) lost)" in err, err[-3000:]
    started = [e["attempt"] for e in written if e["kind"] == "workers_started"]
    assert started[0] == 1 and started[-1] == 5, started
    assert written[-1]["kind"] == "job_end"


def _run_dir_mappings(pid: int, run_dir: Path) -> list[str]:
    """The files under ``run_dir`` that process ``pid`` has mapped into its memory."""
    found = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(f"{run_dir}/"):
            found.append(parts[5])
    return sorted(set(found))


@pytest.mark.parametrize(
    ("mode", "fault"), [("warm", "page-in"), ("cold", "page-in"), ("warm", "unlinked")]
)
def test_progress_counters_whose_run_directory_fails_a_page_in_do_not_kill_the_worker(
    tmp_path: Path, mode: str, fault: str
) -> None:
    """A page-in that fails (an NFS soft mount timing out) made for real: every file under
    the run directory that a training worker has mapped, and each rank's ``progress``, is
    truncated to nothing, so touching a mapped page past the end raises SIGBUS. The counters
    are the agent's memory (a sealed memfd): nothing of the run directory is mapped, the
    workers train on, the job exits 0, and the agent still reads every rank's last step;
    the run directory is left with plain files of the last counts.
    (Before: the mapped file itself; SIGBUS in ``phalanx.step``, and the report blamed the
    worker.) ``unlinked``: each rank's ``progress`` link is removed from the run directory
    instead; the agent reads the counters from the descriptor it holds, not through the
    link, so it still has every rank's last step."""
    marks, logs = tmp_path / "marks", tmp_path / "logs"
    marks.mkdir()
    args = ["--nproc-per-node", "2", "--log-dir", str(logs),
            *(["--cold-start"] if mode == "cold" else []),
            worker("steps_until_go.py"), str(marks)]  # fmt: skip
    with launched(args) as job:
        stepping = [marks / "stepping.0", marks / "stepping.1"]
        wait_for(lambda: all(p.exists() for p in stepping), HANG, "both ranks stepping")
        (run_dir,) = logs.iterdir()
        if fault == "unlinked":
            links = list(run_dir.glob("attempt_0/rank_*/progress"))
            assert len(links) == 2 and all(link.is_symlink() for link in links), links
            for link in links:
                link.unlink()
        else:
            _fail_page_ins(run_dir, [int(p.read_text()) for p in stepping])
        (marks / "go").touch()
        out, err = job.communicate(timeout=HANG)
    assert job.returncode == 0, err[-4000:]
    done = sorted(line.split("]: ", 1)[1] for line in out.splitlines() if " done at step " in line)
    assert [line.split(" done")[0] for line in done] == ["rank 0", "rank 1"], out
    last = {int(line.split()[1]): int(line.split()[-1]) for line in done}
    steps = {}
    for event in read_events(run_dir / "events.jsonl"):
        if event["kind"] == "progress":
            steps[event["rank"]] = event["step"]
    assert steps == last, (steps, last)  # read after the workers ended, from the agent's memfd
    for rank, step in last.items():  # the run left behind: plain files with the last counts
        counters = run_dir / "attempt_0" / f"rank_{rank}" / progress.FILE_NAME
        reading = progress.read(str(counters))
        assert not counters.is_symlink() and reading is not None and reading[1] == step


def _fail_page_ins(run_dir: Path, pids: list[int]) -> None:
    """Every file under ``run_dir`` that ``pids`` have mapped, and each rank's counters,
    truncated to nothing."""
    for pid in pids:
        for path in _run_dir_mappings(pid, run_dir):
            with contextlib.suppress(OSError):
                os.truncate(path, 0)
    for counters in run_dir.glob("attempt_0/rank_*/progress"):
        with contextlib.suppress(OSError):  # the memfd is sealed: EPERM
            os.truncate(counters, 0)
