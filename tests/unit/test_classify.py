"""Pure parts of failure classification and hang analysis, driven by tables."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from phalanx.hang.analysis import RankState, analyse, merge
from phalanx.hang.stacks import Frame, fatal_frame, main_thread, parse_dump
from phalanx.hang.stall import StallDetector
from phalanx.rendezvous.api import EventKind, JobEvent, NodeInfo, RendezvousResult
from phalanx.report.classify import classify, exception_from
from phalanx.report.exits import format_report, root_cause
from phalanx.report.job import blame_hang, lost_node
from phalanx.report.oom import memory_cgroup_counter, oom_kills
from phalanx.supervisor.exits import WorkerExit

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/x/train.py", line 3, in <module>',
    "    loss = step()",
    "    ^^^^^^",
    "ValueError: bad learning rate 1e9",
]


def exit_(returncode: int, tail: list[str] | tuple[str, ...] = (), **kw: object) -> WorkerExit:
    values: dict[str, object] = dict(
        rank=1, local_rank=1, host="h", pid=42, returncode=returncode, time=1.0,
        stopped_by_launcher=False, stderr_tail=tuple(tail),
    )  # fmt: skip
    values.update(kw)
    return WorkerExit(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (TRACEBACK, "ValueError: bad learning rate 1e9"),
        ([f"[rank1]: {line}" for line in TRACEBACK], "ValueError: bad learning rate 1e9"),
        (TRACEBACK[2:], "ValueError: bad learning rate 1e9"),  # header scrolled away
        (
            ["Traceback (most recent call last):", '  File "x", line 1, in f', "KeyError"],
            "KeyError",
        ),
        (["some log line", "giving up"], None),
        (["rank 1 giving up with 7"], None),
        ([*TRACEBACK, "a line printed after the traceback"], "ValueError: bad learning rate 1e9"),
        (  # NCCL's shutdown warning after the traceback, seen on a GPU
            [
                *(f"[rank0]: {line}" for line in TRACEBACK),
                "[rank0]:[W1129 ProcessGroupNCCL.cpp:1575] Warning: x",
            ],
            "ValueError: bad learning rate 1e9",
        ),
        ([], None),
    ],
)
def test_exception_from_tail(tail: list[str], expected: str | None) -> None:
    assert exception_from(tail) == expected


def test_a_printed_traceback_before_another_exit_code_is_not_the_exception() -> None:
    handled = classify(exit_(3, [*TRACEBACK, "recovered; exiting with 3"]))
    assert handled.kind == "exit_code"
    assert classify(exit_(1, [*TRACEBACK, "atexit noise"])).kind == "exception"


@pytest.mark.parametrize(
    ("exit_kw", "evidence", "kind", "reason"),
    [
        (
            {"returncode": 1, "tail": TRACEBACK},
            {},
            "exception",
            "ValueError: bad learning rate 1e9",
        ),
        (
            {"returncode": 1, "error_message": "RuntimeError: nan"},
            {},
            "exception",
            "RuntimeError: nan",
        ),
        ({"returncode": 7, "tail": ["bye"]}, {}, "exit_code", "exit code 7"),
        ({"returncode": 1, "tail": ["bye from the worker"]}, {}, "exit_code", "exit code 1"),
        ({"returncode": -signal.SIGSEGV}, {}, "signal", "killed by SIGSEGV"),
        (
            {"returncode": -signal.SIGSEGV},
            {"fatal_frame": "/x/t.py:5 in f"},
            "signal",
            "killed by SIGSEGV; Python was at /x/t.py:5 in f",
        ),
        ({"returncode": -signal.SIGABRT, "tail": TRACEBACK}, {}, "signal", "killed by SIGABRT"),
        ({"returncode": -signal.SIGKILL}, {}, "killed", "not sent by phalanx"),
        (
            {"returncode": -signal.SIGKILL},
            {"oom_evidence": "cgroup x: oom_kill 0 -> 1"},
            "oom",
            "out of memory (cgroup x: oom_kill 0 -> 1)",
        ),
    ],
)
def test_classify_table(
    exit_kw: dict[str, object], evidence: dict[str, str], kind: str, reason: str
) -> None:
    returncode = int(exit_kw.pop("returncode"))  # type: ignore[call-overload]
    tail = exit_kw.pop("tail", ())
    result = classify(exit_(returncode, tail, **exit_kw), **evidence)  # type: ignore[arg-type]
    assert result.kind == kind and reason in result.reason


def test_classify_leaves_collateral_and_classified_exits_alone() -> None:
    stopped = exit_(-signal.SIGTERM, stopped_by_launcher=True)
    assert classify(stopped) == stopped
    remote = exit_(5, kind="exit_code", reason="exit code 5")
    assert classify(remote) == remote
    assert classify(exit_(0)) == exit_(0)


def test_report_header_shows_the_kind_and_collateral() -> None:
    cause = classify(exit_(1, TRACEBACK))
    other = exit_(-signal.SIGTERM, rank=0, local_rank=0, stopped_by_launcher=True, time=2.0)
    text = format_report([other, cause], attempts=1)
    assert "Root cause: rank 1 (local rank 1) on h (node 0) [exception]" in text
    assert "  ValueError: bad learning rate 1e9" in text
    assert (
        "collateral" in text and "rank 0 (local rank 0) on h (node 0): stopped by phalanx" in text
    )


FAULTHANDLER = """\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 15 in <module>
  File "/src/phalanx/worker/boot.py", line 82 in main
"""


def test_parse_faulthandler_and_find_the_main_thread() -> None:
    threads = parse_dump(FAULTHANDLER)
    assert [len(t.frames) for t in threads] == [2, 4]
    main = main_thread(threads)
    assert main is threads[1]
    assert main.frames[2] == Frame("/job/train.py", 15, "<module>")


def test_fatal_frame_is_the_crashed_threads_innermost(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(
        "--- an earlier dump ---\n" + FAULTHANDLER + "Fatal Python error: Segmentation fault\n\n"
        'Current thread 0x1 (most recent call first):\n  File "/job/t.py", line 9 in crash\n'
        '  File "/job/t.py", line 12 in <module>\n\nExtension modules: numpy (total: 1)\n'
    )
    assert fatal_frame(stacks) == "/job/t.py:9 in crash"  # the user's own frame: no "<-"
    assert fatal_frame(tmp_path / "missing") == ""


def rank(
    r: int, frames: list[Frame] | None, idle: float = 5.0, step: int = -1, beats: int = 0
) -> RankState:
    return RankState(r, r, 0, "h", 100 + r, f"/logs/rank_{r}", idle, beats, step,
                     None if frames is None else tuple(frames))  # fmt: skip


WAIT = [
    Frame("/sp/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
    Frame("/job/t.py", 15, "<module>"),
]
OTHER_WAIT = [
    Frame("/sp/torch/distributed/distributed_c10d.py", 4000, "barrier"),
    Frame("/job/t.py", 30, "<module>"),
]
SLEEP = [Frame("/job/t.py", 14, "<module>")]


@pytest.mark.parametrize(
    ("ranks", "suspects"),
    [
        ([rank(0, WAIT), rank(1, SLEEP)], [1]),  # not in a collective
        ([rank(0, WAIT), rank(1, WAIT, step=9), rank(2, WAIT, step=10)], [1]),  # behind
        ([rank(0, WAIT, beats=7), rank(1, WAIT, beats=6)], [1]),  # behind, in beats
        ([rank(0, WAIT), rank(1, None), rank(2, WAIT)], [1]),  # no stack at all
        ([rank(0, WAIT), rank(1, OTHER_WAIT), rank(2, WAIT)], [1]),  # another collective
        ([rank(0, WAIT), rank(1, WAIT)], []),  # nobody stands out
        ([rank(0, SLEEP), rank(1, SLEEP)], []),  # no torch at all: no basis to accuse
        ([rank(0, WAIT), rank(1, SLEEP, idle=4.0), rank(2, SLEEP, idle=9.0)], [2, 1]),
    ],
)
def test_hang_suspects(ranks: list[RankState], suspects: list[int]) -> None:
    assert [s.rank for s in analyse(ranks, 3.0).suspects] == suspects


def test_culprit_without_suspects_is_the_longest_idle_and_json_round_trips() -> None:
    analysis = analyse([rank(0, WAIT, idle=3.0), rank(1, WAIT, idle=4.0)], 3.0)
    assert analysis.culprit.rank == 1
    assert type(analysis).from_json(analysis.to_json()) == analysis


def test_merge_places_ranks_of_every_node() -> None:
    node0 = analyse([rank(0, WAIT)], 3.0)  # alone, node 0 sees nothing wrong
    node1 = analyse([rank(1, SLEEP)], 3.0)  # alone, node 1 has no collective to compare with
    merged = merge([node0, node1])
    assert merged is not None and [s.rank for s in merged.suspects] == [1]


def test_blame_hang_moves_the_failure_to_the_culprit() -> None:
    stopped = [
        exit_(-signal.SIGTERM, rank=r, local_rank=r, stopped_by_launcher=True) for r in (0, 1)
    ]
    marked = blame_hang(stopped, analyse([rank(0, WAIT), rank(1, SLEEP)], 3.0), detected_at=5.0)
    cause = root_cause(marked)
    assert cause is not None and (cause.rank, cause.kind, cause.exit_code) == (1, "hang", 1)
    assert "not waiting in torch" in cause.reason
    # A job-wide analysis that blames a rank of another node: its record is built.
    remote = blame_hang(marked, analyse([rank(0, WAIT), rank(7, SLEEP)], 3.0), detected_at=5.0)
    cause = root_cause(remote)
    assert cause is not None and cause.rank == 7 and len(remote) == 3
    assert [e.kind for e in remote[:2]] == ["", ""]


def test_lost_node_names_the_node_and_its_ranks() -> None:
    joined = RendezvousResult(
        "job", 0, 0, 0, (NodeInfo(0, "a", "", 2), NodeInfo(1, "b", "", 2)), "a", 1
    )
    lost = lost_node(JobEvent(EventKind.NODE_LOST, 1, "silent"), joined, "node 1 was lost")
    assert lost is not None and (lost.kind, lost.rank, lost.host, lost.node_rank) == (
        "node_lost",
        2,
        "b",
        1,
    )
    assert "ranks 2-3" in lost.reason and lost.failed and lost.exit_code == 1
    assert "Root cause: node 1 (b) [node_lost]" in format_report([lost], 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stall_detector_cpu_until_the_first_beat_then_beats_only() -> None:
    clock = FakeClock()
    detector = StallDetector(10.0, clock)
    for t, progress, cpu in [(0, None, 5), (8, None, 9), (17, None, 9)]:
        clock.now = t
        detector.observe(0, progress, cpu)
    assert detector.stalled() == [] and detector.idle(0) == 9.0  # CPU moved at t=8
    clock.now = 18
    detector.observe(0, None, 9)
    assert detector.stalled() == [0]
    clock.now = 19
    detector.observe(0, (1, 0), 9)  # first beat
    clock.now = 28
    detector.observe(0, (1, 0), 500)  # busy, but no progress
    assert detector.stalled() == []
    clock.now = 29
    detector.observe(0, (1, 0), 900)
    assert detector.stalled() == [0] and detector.progress(0) == (1, 0)


def test_memory_cgroup_counter_v1_and_v2(tmp_path: Path) -> None:
    proc, fs = tmp_path / "proc", tmp_path / "fs"
    proc.mkdir()
    (fs / "memory" / "job").mkdir(parents=True)
    (fs / "memory" / "job" / "memory.oom_control").write_text("oom_kill_disable 0\noom_kill 3\n")
    (proc / "cgroup").write_text("4:memory:/job\n0::/\n")
    (proc / "mountinfo").write_text(
        f"31 23 0:28 / {fs / 'memory'} rw - cgroup cgroup rw,memory\n"
        f"32 23 0:29 / {fs / 'unified'} rw - cgroup2 cgroup2 rw\n"
    )
    counter = memory_cgroup_counter(proc)
    assert counter == fs / "memory" / "job" / "memory.oom_control" and oom_kills(counter) == 3
    (fs / "unified" / "slice").mkdir(parents=True)
    (fs / "unified" / "slice" / "memory.events").write_text("low 0\noom 2\noom_kill 2\n")
    (proc / "cgroup").write_text("0::/slice\n")
    counter = memory_cgroup_counter(proc)
    assert counter == fs / "unified" / "slice" / "memory.events" and oom_kills(counter) == 2
